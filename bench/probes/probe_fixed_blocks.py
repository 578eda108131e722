"""Probe: the fallback against fixed blocks on the CPU default pair.

    python bench/probes/probe_fixed_blocks.py TOKENS REPEATS SUITES ARMS
    (e.g. 128 3 code,copy_edit,math f16,b4,b8,b16)

Arms: fN the shipped fallback (block up to N), bN no fallback at block N;
stock mlx_lm first. Each run is timed whole (prefill included, the same for
every arm), interleaved, one warm-up round; median tokens/s per arm, its
ratio to stock and the pooled tau of the last run. Every output equals
stock greedy. One JSON line per suite (first prompt of each).
"""
import sys, json, time
from mlx_dflash.cli import use_blas; use_blas("auto")
import mlx.core as mx
from mlx_lm.generate import generate_step as stock
from mlx_dflash.load import DEFAULT_DRAFT, load_pair
from mlx_dflash.bench.suites import load_suite
from mlx_dflash.decode import generate_step
from mlx_dflash.fallback import Fallback
from mlx_dflash.stats import SpecStats
from mlx_dflash.train.prompts import encode_messages
pair = load_pair(None, str(DEFAULT_DRAFT), dtype=mx.float32)
T = int(sys.argv[1]); reps = int(sys.argv[2]); suites = sys.argv[3].split(",")
arms = sys.argv[4].split(",")
stops = sorted(pair.tokenizer.eos_token_ids)
for s in suites:
    ids = encode_messages(pair.tokenizer, load_suite(s)["prompts"][0]["messages"])
    ref = None
    res = {a: [] for a in ["stock"] + arms}
    taus = {}
    for r in range(reps + 1):
        for a in ["stock"] + arms:
            st = SpecStats(16)
            t0 = time.perf_counter()
            if a == "stock":
                out = []
                for t, _ in stock(mx.array(ids), pair.target.model, max_tokens=T):
                    out.append(int(t))
                    if int(t) in stops: break
            else:
                kind, b = a[0], int(a[1:])
                fb = Fallback() if kind == "f" else None
                out = [t for t, _ in generate_step(pair.target, ids, pair.drafter.fresh(), max_tokens=T,
                        block_size=b, stop_tokens=stops, fallback=fb, stats=st)]
            sec = time.perf_counter() - t0
            if a == "stock": ref = out
            else: assert out == ref, a
            if r: res[a].append(len(out) / sec); taus[a] = round(st.tau or 0, 2)
    med = {a: sorted(v)[len(v)//2] for a, v in res.items()}
    print(json.dumps({"suite": s, "tok_s": {a: round(v, 1) for a, v in med.items()},
        "x": {a: round(med[a] / med["stock"], 3) for a in arms}, "tau": taus}), flush=True)
