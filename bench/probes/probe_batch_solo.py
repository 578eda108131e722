"""Probe: why one request decodes slower through a batch of one than alone.

    python bench/probes/probe_batch_solo.py qwen3-8b [--rounds 3] [--profile]

On the H200 a batch of one (batch.py, `serve --max-batch C` with one request)
ran 10-13% slower than the one-at-a-time loop (`generate_step`) in every
concurrency bench (bench/results/h200-concurrency-qwen3-8b*.md), though both
decode over the request's own one-row caches. Here the same engine-mode
request (real-size random DFlash draft, oracle tokens at tau 6.5, greedy,
output checked against stock) decodes both ways in alternating rounds, unprobed:
tokens/s and ms per cycle of each, one JSON line per round. With `--profile`, one
more run of each under cProfile prints the functions whose own time differs
most between the two ways (per cycle, ms), which is where the batch of one
spends its extra host time.
"""

import argparse
import cProfile
import json
import pstats
import time

import mlx.core as mx

from probe_batch_cycle import engine_shape  # bench/probes/, beside this script


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    from mlx_lm.generate import generate_step as stock_step

    from mlx_dflash.batch import Batch
    from mlx_dflash.bench.engine import make_engine_drafter
    from mlx_dflash.decode import generate_step
    from mlx_dflash.stats import SpecStats

    model, target, draft, vocab = engine_shape(a.shape, getattr(mx, a.dtype))
    prompt = [(7 * j) % 900 + 1 for j in range(128)]
    ref = [t for t, _ in stock_step(mx.array(prompt), model, max_tokens=a.max_tokens)]

    def drafter():
        return make_engine_drafter(
            draft, target, prompt + ref, tau=6.5, block_size=16, vocab_size=vocab
        )

    def alone(stats):
        steps = generate_step(
            target, prompt, drafter(), max_tokens=a.max_tokens, block_size=16, stats=stats
        )
        return [t for t, _ in steps]

    def batch_of_one(stats):
        b = Batch(target)
        row, first = b.join(
            prompt, drafter(), max_tokens=a.max_tokens, block_size=16, stats=stats
        )
        out = [first[0]]
        while b.rows:
            for _, outputs in b.step():
                out += [t for t, *_ in outputs]
        return out

    ways = {"alone": alone, "batch of one": batch_of_one}

    def run(way):
        stats = SpecStats(block_size=16)
        t0 = time.perf_counter()
        out = ways[way](stats)
        seconds = time.perf_counter() - t0
        assert out == ref, f"{way}: output differs from stock greedy"
        return seconds, stats

    for way in ways:  # warm-up: compiles every kernel both ways use
        run(way)
    for r in range(a.rounds):
        for way in ways:
            seconds, stats = run(way)
            print(json.dumps({
                "shape": a.shape, "round": r, "way": way,
                "tok_s": round(len(ref) / seconds, 1),
                "cycles": stats.cycles,
                "ms_per_cycle": round(seconds * 1e3 / max(1, stats.cycles), 3),
                "tau": round(stats.tau or 0.0, 3),
            }), flush=True)
    if not a.profile:
        return
    own = {}
    for way in ways:
        prof = cProfile.Profile()
        prof.enable()
        _, stats = run(way)
        prof.disable()
        cycles = max(1, stats.cycles)
        table = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
        own[way] = {
            f"{k[2]} ({k[0].rsplit('/', 1)[-1]}:{k[1]})": v[2] * 1e3 / cycles
            for k, v in table.items()
        }
    names = set(own["alone"]) | set(own["batch of one"])
    diff = sorted(
        names,
        key=lambda n: -abs(own["batch of one"].get(n, 0) - own["alone"].get(n, 0)),
    )
    for n in diff[:25]:
        print(json.dumps({
            "function": n,
            "alone_ms_per_cycle": round(own["alone"].get(n, 0), 4),
            "batch_ms_per_cycle": round(own["batch of one"].get(n, 0), 4),
        }), flush=True)


if __name__ == "__main__":
    main()
