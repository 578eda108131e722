"""Probe: a verify's host time (building the graph) against its wall time,
bf16 and then the same target 4-bit quantized in place (issue #25).

    python bench/probes/probe_verify_host.py qwen3.5-9b --context 512
Prints one JSON line per (dtype, rows): median ms to build `Target.forward`'s
graph (no eval), and median ms of build + eval.
"""

import argparse
import json
import statistics
import time

import mlx.core as mx
import mlx.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3.5-9b")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args()
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.rollback import rollback, snapshot
    from mlx_dflash.target import Target

    model = build_target(a.shape, dtype=getattr(mx, a.dtype), peaked=True)
    for bits in (None, 4):
        if bits:
            nn.quantize(model, group_size=64, bits=bits)
            mx.eval(model.parameters())
        target = Target(model)
        cache = target.make_cache()
        mx.eval(target.forward(mx.random.randint(0, 1000, (1, a.context)), cache)[0])
        for rows in (16, 1):
            tokens = mx.random.randint(0, 1000, (1, rows)).astype(mx.uint32)
            build, wall = [], []
            for r in range(a.reps + 3):
                saved = snapshot(cache, target.delta_taps)
                t0 = time.perf_counter()
                logits, _ = target.forward(tokens, cache, flush=True)
                out = mx.argmax(logits, -1)
                t1 = time.perf_counter()
                mx.eval(out)
                t2 = time.perf_counter()
                rollback(cache, target.delta_taps, saved, verified=rows, kept=0)
                mx.eval([c.state for c in cache])
                if r >= 3:
                    build.append((t1 - t0) * 1e3)
                    wall.append((t2 - t0) * 1e3)
            print(json.dumps(dict(shape=a.shape, bits=bits or 16, rows=rows,
                                  build_ms=round(statistics.median(build), 3),
                                  wall_ms=round(statistics.median(wall), 3))), flush=True)


if __name__ == "__main__":
    main()
