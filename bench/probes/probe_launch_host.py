"""Probe: the host's cost of one block-linear launch, dense against 4-bit (issue #25).

A 4-bit draft pass took 0.3 ms longer to build and start than bf16's on one
H100 (bench/results/h100-probe-draft-flush-s40.jsonl, flush_every 1: build
1.52 vs 1.22 ms), though the same launches, fewer bytes. Per launch kind
(o_proj alone; q/k/v with the RMSNorm, 3 weights; gate/up with SwiGLU, 2
weights; and q/k/v as one weight of their rows) at 16 rows of the Qwen3-8B
shapes, median microseconds per launch of: building the lazy graph
(`build_us`: the matmul.py call), and encoding it (`encode_us`:
`mx.async_eval` of --launches independent calls, which encodes and launches
on the calling thread; the wait after it is not counted). A 4-bit launch
passes 3 arrays per weight to the kernel where a dense one passes 1. With
--per-eval N, a sample's launches are encoded N to an `mx.async_eval` (each
one graph, as a flushed draft pass commits a layer's), not all in one.

    python bench/probes/probe_launch_host.py [--launches 64] [--reps 20] [--per-eval N]
"""

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlx_dflash.kernels import matmul


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--launches", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--per-eval", type=int, default=0,
                   help="launches per mx.async_eval (0: all of a sample's in one)")
    a = p.parse_args()
    h, f, kv = 4096, 12288, 1024
    x = mx.random.normal((1, 16, h)).astype(mx.bfloat16)
    norm = (mx.ones((h,), mx.bfloat16), 1e-6)

    def weights(bits, n, k):
        w = (mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16)
        return w if bits is None else matmul.Packed(*mx.quantize(w, 64, bits), 64, bits)

    for bits in (None, 4):
        wq, wk, wv, wo = (weights(bits, n, h) for n in (h, kv, kv, h))
        wg, wu = weights(bits, f, h), weights(bits, f, h)
        wqkv = weights(bits, h + 2 * kv, h)  # q/k/v as one weight: fewer inputs
        mx.eval(x, [w for w in (wq, wk, wv, wo, wg, wu, wqkv)])
        kinds = {
            "o": lambda: [matmul.block_matmul(x, wo, residual=x)],
            "qkv": lambda: matmul.block_matmuls(x, [wq, wk, wv], norm=norm),
            "qkv_one_weight": lambda: matmul.block_matmuls(x, [wqkv], norm=norm),
            "gate_up": lambda: [matmul.block_swiglu(x, wg, wu, norm=norm)],
        }
        for name, fn in kinds.items():
            mx.eval(fn())  # compiles
            build, encode = [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                outs = [y for _ in range(a.launches) for y in fn()]
                t1 = time.perf_counter()
                step = a.per_eval or len(outs)
                for i in range(0, len(outs), step):
                    mx.async_eval(outs[i : i + step])
                t2 = time.perf_counter()
                mx.eval(outs)
                build.append((t1 - t0) / a.launches * 1e6)
                encode.append((t2 - t1) / a.launches * 1e6)
            print(json.dumps(dict(
                launch=name, bits=bits or 16, launches=a.launches, reps=a.reps,
                per_eval=a.per_eval or a.launches,
                build_us=round(statistics.median(build), 2),
                encode_us=round(statistics.median(encode), 2),
            )), flush=True)


if __name__ == "__main__":
    main()
