"""Probe: cost of the GatedDeltaNet recurrence for a 16-token verify on this device.

Compares mlx_lm's path (`gated_delta_update`: Metal kernel on Apple GPUs, per-step
ops loop elsewhere) with MLX core's `mx.fast.gated_delta_update`, on the
Qwen3.5-9B GatedDeltaNet shape (Hk=16, Hv=32, Dk=Dv=128), bf16 inputs, fp32 state.
Prints one JSON line per (T, implementation) and the max abs difference.

    python bench/probes/probe_gdn.py
"""

import json
import time

import mlx.core as mx
from mlx_lm.models.gated_delta import compute_g, gated_delta_update, normalize_qk


def timeit(fn, reps=50):
    for _ in range(3):
        mx.eval(fn())
    tic = time.perf_counter()
    for _ in range(reps):
        mx.eval(fn())
    return (time.perf_counter() - tic) / reps * 1e3


def main():
    Hk, Hv, Dk, Dv = 16, 32, 128, 128
    for T in (1, 16):
        mx.random.seed(0)
        q = mx.random.normal((1, T, Hk, Dk)).astype(mx.bfloat16)
        k = mx.random.normal((1, T, Hk, Dk)).astype(mx.bfloat16)
        q, k = normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)
        v = mx.random.normal((1, T, Hv, Dv)).astype(mx.bfloat16)
        a = mx.random.normal((1, T, Hv)).astype(mx.bfloat16)
        b = mx.random.normal((1, T, Hv)).astype(mx.bfloat16)
        A_log = mx.log(mx.random.uniform(1, 16, (Hv,)))
        dt_bias = mx.ones((Hv,), dtype=mx.bfloat16)
        state = mx.random.normal((1, Hv, Dv, Dk)) * 0.1

        stock = lambda: gated_delta_update(q, k, v, a, b, A_log, dt_bias, state)
        g = compute_g(A_log, a, dt_bias)
        beta = mx.sigmoid(b)
        core = lambda: mx.fast.gated_delta_update(q, k, v, g, beta, state)
        y1, s1 = stock()
        y2, s2 = core()
        diff = max(
            mx.abs(y1.astype(mx.float32) - y2.astype(mx.float32)).max().item(),
            mx.abs(s1 - s2.astype(mx.float32)).max().item(),
        )
        for name, fn in (("mlx_lm", stock), ("mx.fast", core)):
            print(
                json.dumps(
                    {
                        "T": T,
                        "impl": name,
                        "ms": round(timeit(fn), 4),
                        "max_abs_diff": diff,
                        "device": str(mx.default_device()),
                    }
                )
            )


if __name__ == "__main__":
    main()
