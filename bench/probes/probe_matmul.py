"""Probe: what a 16-row bf16 matmul costs against a 1-row one, per Qwen3-8B linear.

A verify forward is the same weights read once for 16 rows instead of one, so it
should cost about one decode step; this shows where MLX's kernels agree.
For each (in, out) shape: `x @ W.T` (nn.Linear's form) at 1 and 16 rows, the
transposed form `(W @ x.T).T`, and the weight-read floor at the device's
measured copy bandwidth. Each figure is per call, from `--calls` calls queued
and evaluated at once over rotating weights (one forward's worth of layers,
weights never all in L2), so launch latency and cache hits do not dominate.

    python bench/probes/probe_matmul.py [--rows 1,2,4,8,16]
"""

import argparse
import json
import time

import mlx.core as mx

SHAPES = {  # Qwen3-8B: hidden 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936
    "qkv": (4096, 6144),
    "o": (4096, 4096),
    "gate_up": (4096, 12288),
    "down": (12288, 4096),
    "lm_head": (4096, 151936),
}


def median_ms(fn, reps=50):
    fn()
    mx.synchronize()
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        times.append((time.perf_counter() - tic) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bandwidth_gbs():
    a = mx.random.normal((1 << 28,)).astype(mx.bfloat16)  # 512 MB
    ms = median_ms(lambda: a + 1, reps=20)
    return 2 * a.nbytes / ms / 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--calls", type=int, default=36)
    a = p.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    bw = bandwidth_gbs()
    print(json.dumps({"device": str(mx.default_device()), "copy_GBs": round(bw)}))
    for name, (k, n) in SHAPES.items():
        nw = 1 if name == "lm_head" else 8
        ws = [(mx.random.normal((n, k)) * 0.02).astype(mx.bfloat16) for _ in range(nw)]
        mx.eval(ws)
        calls = 1 if name == "lm_head" else a.calls
        row = {"shape": name, "in": k, "out": n, "floor_ms": ws[0].nbytes / bw / 1e6}
        for m in rows:
            x = mx.random.normal((1, m, k)).astype(mx.bfloat16)
            row[f"xWt_m{m}"] = (
                median_ms(lambda: [x @ ws[i % nw].T for i in range(calls)]) / calls
            )
            row[f"Wxt_m{m}"] = (
                median_ms(lambda: [(ws[i % nw] @ x[0].T).T for i in range(calls)])
                / calls
            )
        print(
            json.dumps(
                {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
            )
        )


if __name__ == "__main__":
    main()
