"""Probe: the GPU kernels of one batched cycle (batch.py), by phase, at 1 and
4 rows, with a bf16 and a 4-bit draft — where the batched verify's growth and
the quantized draft's cost go.

Run under Nsight Compute with profiling off at start: the probe switches it on
(`cuProfilerStart`) for one warm `Batch.step` of each configuration only, and
marker kernels split that step into its verify (snapshot, forward,
acceptance), commit (rollback, the drafters' context pass and records) and
draft (the next cycle's batched draft) phases:

    ncu --clock-control none --profile-from-start off --csv \\
        --metrics gpu__time_duration.sum \\
        python bench/probes/probe_batch_kernels.py qwen3-8b > batch.csv
    python bench/probes/probe_batch_kernels.py --table batch.csv

`--quantize 4` quantizes the target as `bench --quantize 4` does; `--rows`
and `--draft-bits` pick the configurations (0: the bf16 draft).
"""

import argparse
import ctypes
import re
from collections import defaultdict

import mlx.core as mx

from probe_verify_kernels import KINDS as VERIFY_KINDS
from probe_verify_kernels import marker  # bench/probes/, beside this script

KINDS = [  # the verify probe's kinds and a batched cycle's others
    *VERIFY_KINDS,
    ("GatedDeltaNet", "dflash_gated_delta"),
    ("cuDNN / sdpa", "cudnn|sdpa|fmha|flash_fwd"),
    ("gemm (cuBLAS)", "gemm|Gemm|cutlass|sm90_xmma"),
]


def run(shape, rows, bits, quantize, group_size, max_tokens):
    from mlx_dflash import batch as batch_mod
    from mlx_dflash.bench.engine import make_engine_drafter
    from mlx_dflash.bench.shapes import PRESETS, build_draft, build_target
    from mlx_dflash.load import quantize_draft
    from mlx_dflash.target import Target

    cuda = ctypes.CDLL("libcuda.so.1")
    model = build_target(shape, quantize=quantize, group_size=group_size, peaked=True)
    target = Target(model)
    vocab = PRESETS[shape][2] or target.vocab_size
    drafts = {}
    for b in bits:
        d = build_draft(shape, target.num_layers)
        drafts[b] = quantize_draft(d, b) if b else d
    target.set_capture_layers(drafts[bits[0]].args.target_layer_ids)

    # Phase markers: at the rollback (verify done) and at the batched draft.
    tag = {"now": None}
    for name in ("rollback", "rollback_rows", "prefetch"):
        fn = getattr(batch_mod, name)

        def marked(*a, _fn=fn, _phase="draft" if name == "prefetch" else "commit", **k):
            if tag["now"] is not None:
                marker(f"{_phase}_{tag['now']}")
            return _fn(*a, **k)

        setattr(batch_mod, name, marked)

    for c in rows:
        for b in bits:
            batch = batch_mod.Batch(target)
            for i in range(c):
                prompt = [(31 * i + 7 * j) % 900 + 1 for j in range(64 + 16 * i)]
                ref = prompt + [(13 * i + 5 * j) % 900 + 1 for j in range(max_tokens)]
                d = make_engine_drafter(
                    drafts[b], target, ref, tau=6.5, block_size=16, vocab_size=vocab
                )
                batch.join(prompt, d, max_tokens=max_tokens, block_size=16)
            for _ in range(4):  # warm: compiles, key lengths met
                batch.step()
            name = f"r{c}b{b}"
            mx.synchronize()
            rc = cuda.cuProfilerStart()
            marker(f"verify_{name}")
            tag["now"] = name
            batch.step()
            mx.synchronize()
            marker(f"end_{name}")
            tag["now"] = None
            cuda.cuProfilerStop()
            print(f"# {name}: cuProfilerStart -> {rc}", flush=True)
            while batch.rows:
                batch.step()


def table(path: str):
    from ncu_table import launches

    section, sums, counts = None, defaultdict(float), defaultdict(int)
    order = []
    for launch in launches(path):
        name = launch["name"]
        m = re.search(r"probe_marker_([a-z]+_r\d+b\d+)", name)
        if m:
            section = m.group(1)
            if section not in order:
                order.append(section)
            continue
        if section is None or section.startswith("end"):
            continue
        kind = next((k for k, p in KINDS if re.search(p, name)), name[:60])
        if re.search(r"dflash_block_linear_.*_q[48]", name):
            kind += " (packed)"
        us = float(launch["gpu__time_duration.sum"].replace(",", "")) / 1e3
        sums[section, kind] += us
        counts[section, kind] += 1
    for s in order:
        if s.startswith("end"):
            continue
        total = sum(v for (x, _), v in sums.items() if x == s)
        n = sum(v for (x, _), v in counts.items() if x == s)
        print(f"== {s}: {n} kernels, {total / 1e3:.3f} ms of GPU time")
        for (x, kind), v in sorted(sums.items(), key=lambda kv: -kv[1]):
            if x == s and v >= 5:
                print(f"  {kind:60s} {counts[x, kind]:5d} {v:9.1f} us")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--rows", default="1,4")
    p.add_argument("--draft-bits", default="0,4", help="0: the bf16 draft")
    p.add_argument("--quantize", type=int, choices=(4, 8))
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--table", help="print the kernels of an ncu --csv log by phase")
    a = p.parse_args()
    if a.table:
        table(a.table)
        return
    rows = [int(x) for x in a.rows.split(",")]
    bits = [int(x) for x in a.draft_bits.split(",")]
    run(a.shape, rows, bits, a.quantize, a.group_size, a.max_tokens)


if __name__ == "__main__":
    main()
