"""Probe: where a verify's host time goes (issue #25: the 4-bit 9B verify is
host-bound, bench/results/h200-probe-verify-host-qwen3_5-9b.jsonl).

    python bench/probes/probe_verify_profile.py qwen3.5-9b --context 512 [--quantize 4]
For the block path and the stock path (no kernels), 16 rows and 1, prints one
JSON line each: median ms to build the graph (`Target.forward`, no flush),
to encode it (`mx.async_eval` returning: MLX's host work per node), and the
wall time to the result; and the graph's primitives by kind (`mx.export_to_dot`).
Then the 12 Python functions costing most own time over the block path's
16-row builds (cProfile), to say which wrapper or op the host spends on.
"""

import argparse
import collections
import cProfile
import io
import json
import pstats
import re
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_flatten


def primitives(*outputs) -> collections.Counter:
    f = io.StringIO()
    mx.export_to_dot(f, *outputs)
    return collections.Counter(re.findall(r'label ="([^"]+)", shape=rectangle', f.getvalue()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3.5-9b")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--quantize", type=int, default=None)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args()
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.kernels import BlockPath
    from mlx_dflash.rollback import rollback, snapshot
    from mlx_dflash.target import Target

    model = build_target(
        a.shape, dtype=getattr(mx, a.dtype), peaked=True, quantize=a.quantize
    )
    mx.eval(model.parameters())
    for path in ("block", "stock"):
        target = Target(model, block_path=None if path == "block" else BlockPath.choose(None))
        cache = target.make_cache()
        mx.eval(target.forward(mx.random.randint(0, 1000, (1, a.context)), cache)[0])
        for rows in (16, 1):
            tokens = mx.random.randint(0, 1000, (1, rows)).astype(mx.uint32)
            build, encode, wall = [], [], []
            prof = cProfile.Profile() if (path, rows) == ("block", 16) else None
            for r in range(a.reps + 3):
                saved = snapshot(cache, target.delta_taps)
                mx.synchronize()
                t0 = time.perf_counter()
                if prof and r >= 3:
                    prof.enable()
                logits, _ = target.forward(tokens, cache)
                out = mx.argmax(logits, -1)
                if prof and r >= 3:
                    prof.disable()
                t1 = time.perf_counter()
                if r == 0:
                    kinds = primitives(out, *[v for _, v in tree_flatten([c.state for c in cache]) if isinstance(v, mx.array)])
                mx.async_eval(out)
                t2 = time.perf_counter()
                mx.eval(out)
                t3 = time.perf_counter()
                rollback(cache, target.delta_taps, saved, verified=rows, kept=0)
                mx.eval([c.state for c in cache])
                if r >= 3:
                    build.append((t1 - t0) * 1e3)
                    encode.append((t2 - t1) * 1e3)
                    wall.append((t3 - t0) * 1e3)
            med = lambda v: round(statistics.median(v), 3)
            print(json.dumps(dict(
                shape=a.shape, bits=a.quantize or 16, path=path, rows=rows,
                build_ms=med(build), encode_ms=med(encode), wall_ms=med(wall),
                nodes=sum(kinds.values()), kinds=dict(kinds.most_common()),
            )), flush=True)
            if prof:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(12)
                print(s.getvalue(), flush=True)


if __name__ == "__main__":
    main()
