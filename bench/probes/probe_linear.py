"""Probe: a 16-row product per Qwen3-8B linear, cuBLAS (MLX's path) vs linear.py.

Per call, from `--calls` calls queued and evaluated at once over 8 rotating
weights (as probe_matmul.py): `x @ W.T` with 1 row (MLX's gemv; a decode step),
with 16 rows (cuBLASLt; a verify block), and `block_matmul` with 16 rows.
`build` is the Python time to queue the calls, `total` adds their evaluation.
Also the largest difference between the two 16-row results.

    python bench/probes/probe_linear.py [--rows 16] [--calls 36]
"""

import argparse
import json
import time

import mlx.core as mx

from mlx_dflash.kernels.matmul import block_matmul

SHAPES = {  # Qwen3-8B: hidden 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936
    "q_o": (4096, 4096),
    "k_v": (4096, 1024),
    "gate_up": (4096, 12288),
    "down": (12288, 4096),
    "lm_head": (4096, 151936),
}


def timed(fn, reps=30):
    mx.eval(fn())
    build, total = [], []
    for _ in range(reps):
        tic = time.perf_counter()
        out = fn()
        build.append(time.perf_counter() - tic)
        mx.eval(out)
        total.append(time.perf_counter() - tic)
    med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3
    return med(build), med(total)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--calls", type=int, default=36)
    p.add_argument(
        "--sweep", action="store_true", help="also time other tilings of the kernel"
    )
    a = p.parse_args()
    # Per-node floor: the same number of tiny elementwise kernels.
    tiny = mx.zeros((16, 4096), mx.bfloat16)
    b, t = timed(lambda: [tiny + i for i in range(a.calls)])
    print(
        json.dumps(
            {
                "tiny_add_build_ms": round(b / a.calls, 4),
                "tiny_add_ms": round(t / a.calls, 4),
            }
        )
    )
    print(json.dumps({"device": str(mx.default_device()), "rows": a.rows}))
    for name, (k, n) in SHAPES.items():
        nw = 1 if name == "lm_head" else 8
        calls = 1 if name == "lm_head" else a.calls
        ws = [
            (mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16) for _ in range(nw)
        ]
        x1 = mx.random.normal((1, 1, k)).astype(mx.bfloat16)
        x = mx.random.normal((1, a.rows, k)).astype(mx.bfloat16)
        mx.eval(ws, x1, x)
        row = {"shape": name, "in": k, "out": n}
        for label, f in [
            ("gemv_1row", lambda: [x1 @ ws[i % nw].T for i in range(calls)]),
            ("cublas", lambda: [x @ ws[i % nw].T for i in range(calls)]),
            ("kernel", lambda: [block_matmul(x, ws[i % nw]) for i in range(calls)]),
        ]:
            b, t = timed(f)
            row[f"{label}_build_ms"] = round(b / calls, 4)
            row[f"{label}_ms"] = round(t / calls, 4)
        if a.sweep:
            for cols in (8, 16, 32):
                for warps in (4, 8, 16):
                    if k % (64 * warps) or n % cols:
                        continue
                    f = lambda: [
                        block_matmul(x, ws[i % nw], cols=cols, warps=warps)
                        for i in range(calls)
                    ]
                    row[f"kernel_c{cols}_w{warps}_ms"] = round(timed(f)[1] / calls, 4)
        d = (x @ ws[0].T).astype(mx.float32) - block_matmul(x, ws[0]).astype(mx.float32)
        row["max_abs_diff"] = round(mx.abs(d).max().item(), 5)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
