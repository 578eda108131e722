"""The GatedDeltaNet verify path: same layer output as stock, same recurrence as the ops reference."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import on_cuda
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.gated_delta import gated_delta_ops, normalize_qk
from models import tiny_model

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
