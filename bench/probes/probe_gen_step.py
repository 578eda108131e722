"""Probe: the training data generator's decode step (train/data.py `greedy_batch`).

    python bench/probes/probe_gen_step.py --rows 256,1024 --prompt 256,1024 --tokens 64

The smollm2-135m shape (random weights, float16, as the recipe's dequantized
target) answers B synthetic prompts of P tokens with T new tokens through
`greedy_batch`; per (B, P) and way (`--ways`: `fold`, its one-token steps'
attention in `folded_attention` as shipped; `stock`, MLX's masked attention):
tokens/s (prefill included), and for one decode step over the same
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
    p.add_argument("--ways", default="fold,stock")
    p.add_argument("--ncu", action="store_true")
    p.add_argument("--table")
    a = p.parse_args()
    if a.table:
        return table(a.table)
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.target import Target

    target = Target(build_target(a.shape, dtype=getattr(mx, a.dtype)))
    for B in [int(x) for x in a.rows.split(",")]:
        for P in [int(x) for x in a.prompt.split(",")]:
            for way in a.ways.split(","):
                print(json.dumps(run(target, way, B, P, a.tokens, a.ncu)), flush=True)
                if a.ncu:
                    return


def run(target, way, B, P, tokens, ncu):
    from contextlib import nullcontext

    from mlx_dflash.cache import PaddedBatchKVCache
    from mlx_dflash.kernels.attention import folded_steps
    from mlx_dflash.train import data

    def attention():
        return folded_steps(target.layers) if way == "fold" else nullcontext()

    data.folded_steps = lambda layers: attention()  # greedy_batch's
    vocab = target.vocab_size
    prompts = [[(37 * r + 11 * j) % (vocab - 1) + 1 for j in range(P)] for r in range(B)]
    data.greedy_batch(target, prompts, stop_tokens=[], max_tokens=8)  # warm-up
    t0 = time.perf_counter()
    outs = data.greedy_batch(target, prompts, stop_tokens=[], max_tokens=tokens)
    sec = time.perf_counter() - t0
    n = sum(len(o) for o in outs)
    # One decode step at the same shapes, host build and wait apart (each
    # step writes the same column again: one key length throughout).
    capacity = -(-(P + tokens) // 256) * 256
    cache = [PaddedBatchKVCache(mx.zeros((B,), mx.int32), capacity) for _ in target.layers]
    x = mx.array(prompts)
    for c0 in range(0, P, 512):
        target.forward(x[:, c0 : c0 + 512], cache, last_only=True)
        mx.eval([c.keys for c in cache])
    y = mx.zeros((B, 1), mx.uint32)

    def step():
        logits, _ = target.forward(y, cache, last_only=True)
        out = mx.argmax(logits[:, -1], axis=-1)
        for c in cache:
            c.idx, c.offset = c.idx - 1, c.offset - 1
        return out

    build, wait, whole = [], [], []
    with attention():
        for i in range(6):
            mx.synchronize()
            t0 = time.perf_counter()
            nxt = step()
            t1 = time.perf_counter()
            mx.eval(nxt)
            t2 = time.perf_counter()
            if i:
                build.append((t1 - t0) * 1e3)
                wait.append((t2 - t1) * 1e3)
                whole.append((t2 - t0) * 1e3)
        if ncu:
            from probe_verify_kernels import marker  # bench/probes/

            cuda = ctypes.CDLL("libcuda.so.1")
            mx.synchronize()
            cuda.cuProfilerStart()
            marker("step")
            mx.eval(step())
            mx.synchronize()
            marker("end")
            cuda.cuProfilerStop()
    med = lambda v: round(sorted(v)[len(v) // 2], 3)
    return {
        "way": way, "rows": B, "prompt": P, "capacity": capacity, "new_tokens": tokens,
        "tok_s": round(n / sec, 1), "ms_per_step": round(sec * 1e3 / tokens, 2),
        "sync_step_ms": med(whole), "build_ms": med(build), "wait_ms": med(wait),
    }


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
