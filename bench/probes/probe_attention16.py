"""Probe: where a 16-query verify's attention time goes, by path and context.

Qwen3-8B attention shape (32 q heads, 8 kv heads, head_dim 128), bf16. For each
context length, times 36 calls queued back to back and evaluated once (one
verify's worth of layers; throughput, not launch latency), median of `--reps`:

  vector1      stock decode: 1 query, exact keys, no mask (MLX's vector kernel)
  fast_bool    16 queries, padded buffer + boolean mask (what BucketKVCache hands
               mlx_lm today: cuDNN on CUDA unless MLX_CUDA_USE_CUDNN_SDPA=0)
  fast_add     same with an additive bf16 mask
  fast_exact   16 queries, exact keys, "causal" (a new key length compiles; the
               lengths here are fixed, so this is the warm cost)
  ops_folded   plain ops, GQA folded into the query axis: (8, 64 rows) @ K^T,
               where, precise softmax, @ V
  ops_split    ops_folded on the committed keys + the 16 block keys apart,
               joined by their log-sum-exps (no mask over the long part)
Also prints each path's max |diff| to fast_bool's output.

    python bench/probes/probe_attention16.py [--contexts 1024 8192 16384] [--reps 10]
"""

import argparse
import json
import time

import mlx.core as mx

from mlx_dflash.cache import bucket_mask

H, HK, D, Q, LAYERS = 32, 8, 128, 16, 36


def ops_folded(q, k, v, mask, scale):
    B, _, n, _ = q.shape
    rep = H // HK
    qf = (q * scale).reshape(B, HK, rep * n, D)
    s = qf @ k.swapaxes(-1, -2)
    m = mx.broadcast_to(mask[None], (rep, n, mask.shape[-1])).reshape(rep * n, -1)
    s = mx.where(m, s, mx.finfo(s.dtype).min)
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ v).reshape(B, H, n, D)


def ops_split(q, k_old, v_old, k_new, v_new, scale):
    """Attention over [old ; new] keys: old fully visible, new causal."""
    B, _, n, _ = q.shape
    rep = H // HK
    qf = (q * scale).reshape(B, HK, rep * n, D).astype(mx.float32)
    s1 = qf @ k_old.swapaxes(-1, -2).astype(mx.float32)
    s2 = qf @ k_new.swapaxes(-1, -2).astype(mx.float32)
    causal = mx.arange(n)[None] <= mx.arange(n)[:, None]
    causal = mx.broadcast_to(causal[None], (rep, n, n)).reshape(rep * n, n)
    s2 = mx.where(causal, s2, -mx.inf)
    m = mx.maximum(s1.max(-1, keepdims=True), s2.max(-1, keepdims=True))
    p1, p2 = mx.exp(s1 - m), mx.exp(s2 - m)
    z = p1.sum(-1, keepdims=True) + p2.sum(-1, keepdims=True)
    o = (p1.astype(v_old.dtype) @ v_old).astype(mx.float32) + (
        p2.astype(v_new.dtype) @ v_new
    ).astype(mx.float32)
    return (o / z).astype(q.dtype).reshape(B, H, n, D)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 16384])
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    scale = D**-0.5
    for ctx in a.contexts:
        cap = -(-(ctx + Q) // 256) * 256
        qs = [mx.random.normal((1, H, Q, D)).astype(mx.bfloat16) for _ in range(LAYERS)]
        ks = [
            mx.random.normal((1, HK, cap, D)).astype(mx.bfloat16) for _ in range(LAYERS)
        ]
        vs = [
            mx.random.normal((1, HK, cap, D)).astype(mx.bfloat16) for _ in range(LAYERS)
        ]
        mx.eval(qs, ks, vs)
        bmask = bucket_mask(Q, ctx, cap)
        amask = mx.where(bmask, 0.0, -mx.inf).astype(mx.bfloat16)
        n = ctx + Q
        paths = {
            "vector1": lambda i: mx.fast.scaled_dot_product_attention(
                qs[i][:, :, :1], ks[i][:, :, :n], vs[i][:, :, :n], scale=scale
            ),
            "fast_bool": lambda i: mx.fast.scaled_dot_product_attention(
                qs[i], ks[i], vs[i], scale=scale, mask=bmask
            ),
            "fast_add": lambda i: mx.fast.scaled_dot_product_attention(
                qs[i], ks[i], vs[i], scale=scale, mask=amask
            ),
            "fast_exact": lambda i: mx.fast.scaled_dot_product_attention(
                qs[i], ks[i][:, :, :n], vs[i][:, :, :n], scale=scale, mask="causal"
            ),
            "ops_folded": lambda i: ops_folded(qs[i], ks[i], vs[i], bmask, scale),
            "ops_split": lambda i: ops_split(
                qs[i],
                ks[i][:, :, :ctx],
                vs[i][:, :, :ctx],
                ks[i][:, :, ctx:n],
                vs[i][:, :, ctx:n],
                scale,
            ),
        }
        ref = paths["fast_bool"](0)
        for name, f in paths.items():
            try:
                out = f(0)
                err = (
                    0.0
                    if name == "vector1"
                    else float(
                        mx.abs(out.astype(mx.float32) - ref.astype(mx.float32)).max()
                    )
                )
                for _ in range(2):
                    mx.eval([f(i) for i in range(LAYERS)])
                times = []
                for _ in range(a.reps):
                    tic = time.perf_counter()
                    mx.eval([f(i) for i in range(LAYERS)])
                    times.append((time.perf_counter() - tic) * 1e3)
                times.sort()
                res = {"ms_36_layers": round(times[len(times) // 2], 3)}
                res["max_abs_diff"] = round(err, 5)
            except Exception as e:  # a path MLX refuses here: say so, go on
                res = {"error": str(e)[:200]}
            print(json.dumps({"context": ctx, "path": name, **res}), flush=True)


if __name__ == "__main__":
    main()
