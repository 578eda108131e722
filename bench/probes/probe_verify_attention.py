"""Probe (measurement only): the verify forward with 16-query attention as plain
ops (GQA folded into the query axis) instead of MLX's fused call, which on CUDA
routes such blocks to cuDNN.

mlx_lm's attention layers call `scaled_dot_product_attention` from their model
module; for this probe only, that name is swapped *in this process* for a
function that sends 2..64-query inputs to the ops version. The product does not
do this (no patching of mlx_lm); the numbers say what a supported hook would buy.

    python bench/probes/probe_verify_attention.py [qwen3-8b] [--contexts 1024 16384] [--reps 10]
"""

import argparse
import importlib
import json
import time

import mlx.core as mx

from mlx_dflash.bench.shapes import build_target
from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.target import Target

MODULES = {"qwen3-8b": "mlx_lm.models.qwen3", "tiny-qwen3": "mlx_lm.models.qwen3"}


def folded(queries, keys, values, scale, mask):
    B, H, n, D = queries.shape
    Hk = keys.shape[1]
    rep = H // Hk
    q = (queries * scale).reshape(B, Hk, rep * n, D)
    s = q @ keys.swapaxes(-1, -2)
    if mask is not None:
        m = mask.reshape(n, -1)
        m = mx.broadcast_to(m[None], (rep, n, m.shape[-1])).reshape(rep * n, -1)
        s = mx.where(m, s, mx.finfo(s.dtype).min)
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ values).reshape(B, H, n, D)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 16384])
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    mod = importlib.import_module(MODULES[a.shape])
    stock_sdpa = mod.scaled_dot_product_attention

    def routed(queries, keys, values, cache, scale, mask, **kw):
        n = queries.shape[2]
        if use_ops[0] and 1 < n <= 64 and not isinstance(mask, str):
            return folded(queries, keys, values, scale, mask)
        return stock_sdpa(
            queries, keys, values, cache=cache, scale=scale, mask=mask, **kw
        )

    use_ops = [False]
    mod.scaled_dot_product_attention = routed
    model = build_target(a.shape)
    block = mx.random.randint(0, 1000, (1, 16))
    for ctx in a.contexts:
        target = Target(model)
        cache = target.make_cache()
        for s in range(0, ctx, 2048):
            target.forward(mx.random.randint(0, 1000, (1, min(2048, ctx - s))), cache)
            mx.eval([c.state for c in cache])

        def cycle():
            saved = snapshot(cache, target.delta_taps)
            logits, _ = target.forward(block, cache, flush=True)
            out = mx.argmax(logits, -1)
            mx.eval(out)
            rollback(cache, target.delta_taps, saved, verified=16, kept=0)
            mx.eval([c.state for c in cache])
            return logits

        use_ops[0] = False
        ref = cycle()
        use_ops[0] = True
        diff = float(mx.abs(cycle().astype(mx.float32) - ref.astype(mx.float32)).max())
        times = {True: [], False: []}
        for r in range(a.reps + 2):
            for on in (True, False):
                use_ops[0] = on
                tic = time.perf_counter()
                cycle()
                if r >= 2:
                    times[on].append((time.perf_counter() - tic) * 1e3)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        print(
            json.dumps(
                {
                    "shape": a.shape,
                    "context": ctx,
                    "verify16_ms_ops_folded": round(med[True], 3),
                    "verify16_ms_fused_call": round(med[False], 3),
                    "max_abs_logit_diff": round(diff, 4),
                    "device": str(mx.default_device()),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
