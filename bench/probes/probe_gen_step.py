"""Probe: the training data generator's decode step (train/data.py `greedy_batch`).

    python bench/probes/probe_gen_step.py --rows 256,1024 --prompt 256,1024 --tokens 64

The smollm2-135m shape (random weights, float16, as the recipe's dequantized
target) answers B synthetic prompts of P tokens with T new tokens through
`greedy_batch`; per (B, P): tokens/s, and for one decode step over the same
`PaddedBatchKVCache` the host's graph build, the evaluation's wait and the
whole synchronous step (ms). With `--ncu`, one warm decode step of the first
(B, P) runs between profiler markers: under
    ncu --clock-control none --profile-from-start off --csv \\
        --metrics gpu__time_duration.sum python probe_gen_step.py --ncu ... > gen.csv
    python probe_gen_step.py --table gen.csv
"""

import argparse
import ctypes
import json
import time
from collections import defaultdict

import mlx.core as mx


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--rows", default="256,1024")
    p.add_argument("--prompt", default="256,1024")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--table")
    a = p.parse_args()
    if a.table:
        return table(a.table)
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.cache import PaddedBatchKVCache
    from mlx_dflash.target import Target
    from mlx_dflash.train.data import greedy_batch

    target = Target(build_target(a.shape, dtype=getattr(mx, a.dtype)))
    vocab = target.vocab_size
    for B in [int(x) for x in a.rows.split(",")]:
        for P in [int(x) for x in a.prompt.split(",")]:
            prompts = [[(37 * r + 11 * j) % (vocab - 1) + 1 for j in range(P)] for r in range(B)]
            greedy_batch(target, prompts, stop_tokens=[], max_tokens=8)  # warm-up
            t0 = time.perf_counter()
            outs = greedy_batch(target, prompts, stop_tokens=[], max_tokens=a.tokens)
            sec = time.perf_counter() - t0
            n = sum(len(o) for o in outs)
            # One decode step at the same shapes, host build and wait apart.
            capacity = -(-(P + a.tokens) // 256) * 256
            cache = [PaddedBatchKVCache(mx.zeros((B,), mx.int32), capacity) for _ in target.layers]
            x = mx.array(prompts)
            for c0 in range(0, P, 512):
                target.forward(x[:, c0 : c0 + 512], cache, last_only=True)
                mx.eval([c.keys for c in cache])
            y = mx.zeros((B, 1), mx.uint32)
            build, wait, whole = [], [], []
            for i in range(6):
                mx.synchronize()
                t0 = time.perf_counter()
                logits, _ = target.forward(y, cache, last_only=True)
                nxt = mx.argmax(logits[:, -1], axis=-1)
                t1 = time.perf_counter()
                mx.eval(nxt)
                t2 = time.perf_counter()
                if i:
                    build.append((t1 - t0) * 1e3)
                    wait.append((t2 - t1) * 1e3)
                    whole.append((t2 - t0) * 1e3)
                y = nxt[:, None]
            med = lambda v: round(sorted(v)[len(v) // 2], 3)
            print(json.dumps({
                "rows": B, "prompt": P, "capacity": capacity, "new_tokens": a.tokens,
                "tok_s": round(n / sec, 1), "ms_per_step": round(sec * 1e3 / a.tokens, 2),
                "sync_step_ms": med(whole), "build_ms": med(build), "wait_ms": med(wait),
            }), flush=True)
            if a.ncu:
                from probe_verify_kernels import marker  # bench/probes/

                cuda = ctypes.CDLL("libcuda.so.1")
                mx.synchronize()
                cuda.cuProfilerStart()
                marker("step")
                logits, _ = target.forward(y, cache, last_only=True)
                mx.eval(mx.argmax(logits[:, -1], axis=-1))
                mx.synchronize()
                marker("end")
                cuda.cuProfilerStop()
                return


def table(path):
    from ncu_table import launches  # bench/probes/

    sums, counts, on = defaultdict(float), defaultdict(int), False
    for launch in launches(path):
        name = launch["name"]
        if "probe_marker_" in name:
            on = "probe_marker_step" in name
            continue
        if on:
            k = name[:70]
            sums[k] += float(launch["gpu__time_duration.sum"].replace(",", "")) / 1e3
            counts[k] += 1
    print(f"{sum(counts.values())} kernels, {sum(sums.values()) / 1e3:.3f} ms of GPU time")
    for k in sorted(sums, key=lambda k: -sums[k]):
        print(f"  {k:72s} {counts[k]:4d} {sums[k]:9.1f} us")


if __name__ == "__main__":
    main()
