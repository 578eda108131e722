"""The GatedDeltaNet verify path: same layer output as stock, same recurrence as the ops reference."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import on_cuda
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.gated_delta import gated_delta_ops, normalize_qk
from models import kernel_model, tiny_model

from mlx_dflash.kernels.gdn import BlockDelta, gated_delta, gated_delta_cuda


def test_fast_layer_matches_stock_layer():
    """BlockDelta mirrors the stock forward (without a backend both run the
    stock recurrence)."""
    model = tiny_model("qwen3_5")
    stock = model.layers[0].linear_attn
    fast = BlockDelta(tiny_model("qwen3_5").layers[0].linear_attn)
    x = mx.random.normal((1, 7, 64))
    c1, c2 = ArraysCache(2), ArraysCache(2)
    for chunk in (x[:, :3], x[:, 3:4], x[:, 4:]):
        a, b = stock(chunk, None, c1), fast(chunk, None, c2)
        assert np.abs(np.array(a) - np.array(b)).max() < 1e-6
    for s1, s2 in zip(c1.cache, c2.cache):
        assert np.abs(np.array(s1) - np.array(s2)).max() < 1e-6


def random_inputs(T, Hk, Hv, Dk, Dv, dtype, seed=0):
    mx.random.seed(seed)
    q = mx.random.normal((1, T, Hk, Dk)).astype(dtype)
    k = mx.random.normal((1, T, Hk, Dk)).astype(dtype)
    q, k = normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6)
    v = mx.random.normal((1, T, Hv, Dv)).astype(dtype)
    g = mx.random.uniform(0.3, 1.0, (1, T, Hv))
    beta = mx.random.uniform(0, 1, (1, T, Hv)).astype(dtype)
    state = mx.random.normal((1, Hv, Dv, Dk)) * 0.1
    return q, k, v, g, beta, state


@on_cuda
@pytest.mark.parametrize("T", [1, 2, 7, 16, 100])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_cuda_kernel_matches_ops_reference(T, dtype):
    q, k, v, g, beta, state = random_inputs(T, 2, 4, 64, 32, dtype)
    y1, s1 = gated_delta_ops(q, k, v, g, beta, state)
    y2, s2 = gated_delta_cuda(q, k, v, g, beta, state)
    tol = 1e-5 if dtype == mx.float32 else 2e-2
    assert (
        np.abs(np.array(y1.astype(mx.float32)) - np.array(y2.astype(mx.float32))).max()
        < tol
    )
    assert np.abs(np.array(s1) - np.array(s2)).max() < (
        1e-5 if dtype == mx.float32 else 1e-3
    )


def test_gated_delta_falls_back_off_cuda():
    q, k, v, g, beta, state = random_inputs(5, 2, 4, 32, 16, mx.float32)
    a = mx.random.normal((1, 5, 4))
    b = mx.random.normal((1, 5, 4))
    A_log, dt_bias = mx.zeros((4,)), mx.ones((4,))
    y, s = gated_delta(q, k, v, a, b, A_log, dt_bias, state)
    assert y.shape == (1, 5, 4, 16) and s.shape == state.shape


@on_cuda
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_cuda_step_states_are_the_states_of_shorter_runs(dtype):
    """The verify variant's state after step t is bit-equal to running t+1 steps."""
    T = 16
    q, k, v, g, beta, state = random_inputs(T, 2, 4, 64, 32, dtype)
    y, final, states = gated_delta_cuda(q, k, v, g, beta, state, step_states=True)
    assert states.shape == (T, *state.shape)
    y_plain, final_plain = gated_delta_cuda(q, k, v, g, beta, state)
    assert mx.array_equal(y, y_plain) and mx.array_equal(final, final_plain)
    for t in (0, 3, 6, T - 1):
        sl = slice(0, t + 1)
        _, s_t = gated_delta_cuda(
            q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state
        )
        assert mx.array_equal(states[t], s_t)


def _kernel_layer(dtype):
    """The first GatedDeltaNet of the CUDA kernels' qwen3_5 model (Hk 4, Dk 128,
    Hv 16, Dv 32), in `dtype`, with A_log away from zero."""
    layer = kernel_model("qwen3_5").layers[0].linear_attn
    layer.set_dtype(dtype)
    layer.A_log = mx.random.uniform(-1, 1, layer.A_log.shape).astype(dtype)
    return layer


@on_cuda
@pytest.mark.parametrize("T", [1, 2, 16])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_cuda_conv_kernel_matches_stock_ops(T, dtype):
    """`gated_delta_conv_cuda`: the layer's conv + SiLU, q/k norms, g, beta and
    the recurrence from its conv input in one launch, against the stock ops
    (GatedDeltaNet.__call__'s) and the recurrence kernel; with step states,
    each the state after that step."""
    import mlx.nn as nn

    from mlx_dflash.kernels.gdn import gated_delta_conv_cuda, recurrence_inputs

    mx.random.seed(1)
    layer = _kernel_layer(dtype)
    conv_in = mx.random.normal((1, 3 + T, layer.conv_dim)).astype(dtype)
    a = mx.random.normal((1, T, 16)).astype(dtype)
    b = mx.random.normal((1, T, 16)).astype(dtype)
    state = mx.random.normal((1, 16, 32, 128)) * 0.1
    q, k, v = recurrence_inputs(layer, nn.silu(layer.conv1d(conv_in)))
    g = mx.exp(-mx.exp(layer.A_log.astype(mx.float32)) * nn.softplus(a + layer.dt_bias))
    y1, s1 = gated_delta_ops(q, k, v, g, mx.sigmoid(b), state)
    y2, s2, states = gated_delta_conv_cuda(layer, conv_in, a, b, state, step_states=True)
    # fp32: cuDNN may run the stock conv in TF32
    tol = (2e-3, 2e-3) if dtype == mx.float32 else (3e-2, 5e-3)
    err = np.abs(np.array(y1.astype(mx.float32)) - np.array(y2.astype(mx.float32)))
    assert err.max() < tol[0], err.max()
    assert np.abs(np.array(s1) - np.array(s2)).max() < tol[1]
    assert mx.array_equal(states[T - 1], s2)
    y3, s3 = gated_delta_conv_cuda(layer, conv_in, a, b, state)
    assert mx.array_equal(y3, y2) and mx.array_equal(s3, s2)
