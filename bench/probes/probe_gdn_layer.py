"""Probe: where a Qwen3.5-9B-shape GatedDeltaNet layer spends its time, T=1 vs T=16.

python bench/probes/probe_gdn_layer.py
"""

import json
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.qwen3_5 import GatedDeltaNet, TextModelArgs

from mlx_dflash.kernels.cuda import CudaKernels
from mlx_dflash.kernels.gdn import BlockDelta, gated_delta_cuda


def timeit(fn, reps=30):
    for _ in range(3):
        mx.eval(fn())
    tic = time.perf_counter()
    for _ in range(reps):
        mx.eval(fn())
    return round((time.perf_counter() - tic) / reps * 1e3, 4)


def main():
    args = TextModelArgs(
        model_type="qwen3_5_text",
        hidden_size=4096,
        num_hidden_layers=4,
        intermediate_size=12288,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        rms_norm_eps=1e-6,
        vocab_size=1000,
        linear_num_value_heads=32,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    )
    stock = GatedDeltaNet(args)
    stock.set_dtype(mx.bfloat16)
    stock.A_log = stock.A_log.astype(mx.float32)
    mx.eval(stock.parameters())
    fast = GatedDeltaNet(args)
    fast.update(stock.parameters())
    fast = BlockDelta(fast, CudaKernels())
    stock.eval()
    fast.eval()
    out = {}
    for T in (1, 16):
        x = mx.random.normal((1, T, 4096)).astype(mx.bfloat16)
        for name, layer in (("stock", stock), ("fast", fast)):
            c = ArraysCache(2)
            c[0] = mx.zeros((1, 3, stock.conv_dim), mx.bfloat16)
            c[1] = mx.zeros((1, 32, 128, 128), mx.float32)
            state0 = (c[0], c[1])

            def run():
                c[0], c[1] = state0
                return layer(x, None, c)

            out[f"{name}_layer_T{T}"] = timeit(run)
        conv_in = mx.random.normal((1, T + 3, stock.conv_dim)).astype(mx.bfloat16)
        out[f"conv1d_T{T}"] = timeit(lambda: nn.silu(stock.conv1d(conv_in)))
        out[f"in_proj_qkv_T{T}"] = timeit(lambda: stock.in_proj_qkv(x))
        q = mx.random.normal((1, T, 16, 128)).astype(mx.bfloat16)
        v = mx.random.normal((1, T, 32, 128)).astype(mx.bfloat16)
        g = mx.random.uniform(0.5, 1, (1, T, 32))
        beta = mx.random.uniform(0, 1, (1, T, 32)).astype(mx.bfloat16)
        s = mx.zeros((1, 32, 128, 128))
        out[f"kernel_T{T}"] = timeit(lambda: gated_delta_cuda(q, q, v, g, beta, s))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
