"""Probe: 16-query attention with a growing key length, plain vs bucketed.

Plain: keys of the exact committed length (a new length every verify cycle).
Bucketed: the padded 256-multiple buffer plus a boolean mask (BucketKVCache).
Qwen3-8B attention shape (32 q heads, 8 kv heads, head_dim 128), bf16.

    python bench/probes/probe_attention.py
"""

import json
import time

import mlx.core as mx

from mlx_dflash.cache import bucket_mask


def main():
    H, Hkv, D, Q = 32, 8, 128, 16
    q = mx.random.normal((1, H, Q, D)).astype(mx.bfloat16)
    K = mx.random.normal((1, Hkv, 4096, D)).astype(mx.bfloat16)
    V = mx.random.normal((1, Hkv, 4096, D)).astype(mx.bfloat16)
    mx.eval(q, K, V)
    for mode in ("plain", "bucketed"):
        times = []
        for offset in range(
            1000, 1000 + 40 * 7, 7
        ):  # 40 cycles, 7 tokens accepted each
            n = offset + Q
            tic = time.perf_counter()
            if mode == "plain":
                mask = mx.arange(n)[None] <= mx.arange(offset, n)[:, None]
                out = mx.fast.scaled_dot_product_attention(
                    q, K[:, :, :n], V[:, :, :n], scale=D**-0.5, mask=mask
                )
            else:
                cap = -(-n // 256) * 256
                out = mx.fast.scaled_dot_product_attention(
                    q,
                    K[:, :, :cap],
                    V[:, :, :cap],
                    scale=D**-0.5,
                    mask=bucket_mask(Q, offset, cap),
                )
            mx.eval(out)
            times.append((time.perf_counter() - tic) * 1e3)
        times.sort()
        print(
            json.dumps(
                {
                    "mode": mode,
                    "median_ms": round(times[len(times) // 2], 3),
                    "max_ms": round(times[-1], 3),
                    "mean_ms": round(sum(times) / len(times), 3),
                    "device": str(mx.default_device()),
                }
            )
        )


if __name__ == "__main__":
    main()
