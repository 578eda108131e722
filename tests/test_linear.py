"""Block linear kernel (kernels/matmul.py): equals the stock product on CUDA;
the model instance stays stock outside `Target.forward`; off CUDA nothing
changes; with the backend faked at its one seam (`OpsKernels`), every wrapper
runs on CPU where CUDA would launch a kernel."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.gated_delta import gated_delta_update
from mlx.utils import tree_flatten
from helpers import on_cuda
from models import kernel_model, tiny_model

from mlx_dflash.cache import BucketKVCache
from mlx_dflash.kernels import BlockPath
from mlx_dflash.kernels.cuda import CudaKernels
from mlx_dflash.kernels.gdn import recurrence_inputs
from mlx_dflash.kernels.layer import BlockLayer
from mlx_dflash.kernels.linear import BlockLinear, plain_linears
from mlx_dflash.kernels.matmul import (
    Fits,
    Packed,
    applies,
    block_matmul,
    block_matmuls,
    block_swiglu,
    dense,
    rows_fit,
    tiling,
)
from mlx_dflash.target import Target
from mlx_dflash.wrapper import innermost


def reference(x, w, b=None):
    y = x.astype(mx.float32) @ w.astype(mx.float32).T
    return y if b is None else y + b.astype(mx.float32)


@on_cuda
@pytest.mark.parametrize("rows", [2, 7, 16, 17, 40, 64])
@pytest.mark.parametrize("n,k", [(48, 512), (4096, 1024), (6144, 4096), (1024, 12288)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_kernel_matches_fp32_product(rows, n, k, dtype):
    mx.random.seed(rows + n)
    x = mx.random.normal((1, rows, k)).astype(dtype)
    w = (mx.random.normal((n, k)) * k**-0.5).astype(dtype)
    assert applies(x, w)
    y = block_matmul(x, w)
    assert y.shape == (1, rows, n) and y.dtype == dtype
    err = np.abs(np.array(y.astype(mx.float32)) - np.array(reference(x, w)))
    # Output rounding to bf16/fp16 dominates: |y| is ~1 here.
    assert err.max() < (2e-2 if dtype == mx.bfloat16 else 4e-3)


@on_cuda
def test_kernel_adds_bias():
    x = mx.random.normal((16, 512)).astype(mx.bfloat16)
    w = (mx.random.normal((64, 512)) * 0.05).astype(mx.bfloat16)
    b = mx.random.normal((64,)).astype(mx.bfloat16)
    err = np.abs(
        np.array(block_matmul(x, w, b).astype(mx.float32) - reference(x, w, b))
    )
    assert err.max() < 3e-2


@on_cuda
@pytest.mark.parametrize("rows", [2, 16, 33])
def test_grouped_and_swiglu_kernels(rows):
    mx.random.seed(rows)
    k = 1024
    x = mx.random.normal((1, rows, k)).astype(mx.bfloat16)
    ws = [
        (mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16)
        for n in (512, 128, 128)
    ]
    for y, w in zip(block_matmuls(x, ws), ws):
        assert y.shape == (1, rows, w.shape[0])
        err = np.abs(np.array(y.astype(mx.float32)) - np.array(reference(x, w)))
        assert err.max() < 2e-2
    g, u = ws[0], (mx.random.normal((512, k)) * k**-0.5).astype(mx.bfloat16)
    # As stock: SwiGLU of the two products rounded to bf16.
    gt, ut = [reference(x, w).astype(mx.bfloat16).astype(mx.float32) for w in (g, u)]
    ref = np.array(nn.silu(gt) * ut)
    err = np.abs(np.array(block_swiglu(x, g, u).astype(mx.float32)) - ref)
    assert (err <= 2e-2 * (1 + np.abs(ref))).all()


@on_cuda
@pytest.mark.parametrize("rows", [2, 16, 40])
def test_norm_and_residual_variants(rows):
    """RMSNorm folded into the q/k/v and gate/up launches; residual added by o/down."""
    mx.random.seed(rows)
    k = 1024
    h = (mx.random.normal((1, rows, k)) * 3).astype(mx.bfloat16)
    nw = mx.random.uniform(0.5, 1.5, (k,)).astype(mx.bfloat16)
    normed = mx.fast.rms_norm(h.astype(mx.float32), nw.astype(mx.float32), 1e-6)
    ws = [(mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16) for n in (512, 128)]

    def close(got, ref, tol=3e-2):
        got, ref = np.array(got.astype(mx.float32)), np.array(ref)
        assert (np.abs(got - ref) <= tol * (1 + np.abs(ref))).all()

    for y, w in zip(block_matmuls(h, ws, norm=(nw, 1e-6)), ws):
        close(y, normed @ w.astype(mx.float32).T)
    g, u = ws[0], (mx.random.normal((512, k)) * k**-0.5).astype(mx.bfloat16)
    gt, ut = [normed @ w.astype(mx.float32).T for w in (g, u)]
    close(block_swiglu(h, g, u, norm=(nw, 1e-6)), nn.silu(gt) * ut)
    res = mx.random.normal((1, rows, 512)).astype(mx.bfloat16)
    close(block_matmul(h, g, residual=res), reference(h, g) + res.astype(mx.float32))


def test_applies_only_to_tiled_blocks():
    w = mx.zeros((64, 512), mx.bfloat16)
    if mx.cuda.is_available():
        assert applies(mx.zeros((16, 512), mx.bfloat16), w)
    assert not applies(mx.zeros((1, 512), mx.bfloat16), w)  # one row: MLX's gemv
    assert not applies(mx.zeros((65, 512), mx.bfloat16), w)  # a prefill chunk
    assert not applies(mx.zeros((16, 512), mx.float32), w.astype(mx.float32))
    assert not applies(
        mx.zeros((16, 256), mx.bfloat16), mx.zeros((64, 256), mx.bfloat16)
    )
    assert not applies(
        mx.zeros((16, 512), mx.bfloat16), mx.zeros((40, 512), mx.bfloat16)
    )


def test_fits_checks_each_kind_of_input_once():
    """A wrapper's launch check runs once per kind of block (rows, width,
    dtype, device) and its answer is kept: one entry however many calls."""
    fits, checks = Fits(), []
    for _ in range(3):
        for rows in (16, 32):
            assert fits(mx.zeros((1, rows, 64)), lambda: checks.append(rows) or True)
    assert checks == [16, 32] and len(fits._kept) == 2
    assert not fits(mx.zeros((1, 1, 64)), lambda: True)  # one row: never kept
    assert len(fits._kept) == 2


def test_instances_are_stock_outside_forward():
    model = tiny_model("qwen3")
    x = mx.array([[1, 2, 3, 4]])
    ref = model(x)
    # The plain path (no backend) puts nothing on: the stock logits.
    plain = Target(model, block_path=BlockPath.choose(None), block_linear=True)
    assert not (plain.fitting.layers or plain.fitting.slots or plain.block_linear)
    assert mx.array_equal(plain.forward(x, plain.make_cache())[0], ref).item()
    # A backend's wrappers sit on the instance only inside forward.
    target = Target(model, block_path=BlockPath.choose(OpsKernels()))
    assert len(target.fitting.layers) == len(model.model.layers)
    target.forward(mx.array([list(range(1, 17))]), target.make_cache(bucket=False))
    assert target.fitting.ops.calls["residual"] > 0
    linears = plain_linears(model.model)
    assert len(linears) == 7 * len(model.model.layers)
    assert not any(isinstance(l, BlockLayer) for l in model.model.layers)
    assert not any(isinstance(m, BlockLinear) for _, m in model.named_modules())
    if not mx.cuda.is_available():
        # The default path off CUDA is the plain one.
        assert Target(model).fitting.slots == []


def test_block_linear_falls_back_for_other_inputs():
    layer = nn.Linear(8, 4)
    x = mx.random.normal((3, 8))
    ref = layer(x)
    assert mx.array_equal(BlockLinear(layer, CudaKernels())(x), ref).item()


@on_cuda
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_verify_logits_close_to_stock_products_bf16(family):
    """A bf16 target whose every linear takes the kernel (qwen3_5: its layers'
    norms and residuals folded in, HybridBlockLayer): same logits as without
    it, up to bf16 rounding of the two products' different summation order."""
    mx.random.seed(0)
    model = kernel_model(family)
    tokens = mx.random.randint(0, 1024, (1, 16))
    out = []
    for on in (False, True):
        target = Target(model, block_linear=on)
        out.append(target.forward(tokens, target.make_cache())[0].astype(mx.float32))
    assert np.abs(np.array(out[0] - out[1])).max() < 0.1
    assert (mx.argmax(out[0], -1) == mx.argmax(out[1], -1)).mean().item() > 0.9


def _normed(calls, x, norm):
    if norm is None:
        return x
    calls["norm"] += 1
    return mx.fast.rms_norm(x, norm[0], norm[1])


class OpsKernels(CudaKernels):
    """The kernels' contract written as ops, so CPU tests drive every wrapper
    (BlockLinear, BlockLayer, DraftBlockLayer, fused q/k/v in BlockAttention,
    BlockMLP, the head) exactly where CUDA would launch a kernel, and count
    the launches. CPU's defaults otherwise (no fold, flush or buckets)."""

    fold_from = math.inf
    flush_every = draft_flush_every = 0
    bucket = False

    def __init__(self):
        self.calls = dict.fromkeys(
            ("matmul", "residual", "qkv", "swiglu", "norm", "flash", "delta_conv"), 0
        )
        self.packed = 0  # products of quantized weights

    def applies(self, x, *ws):
        rows = x.size // x.shape[-1]
        return rows_fit(rows, *ws) and all(
            w.dtype == x.dtype and w.shape[1] == x.shape[-1] for w in ws
        )

    def tiled(self, dtype, *ws):
        return True

    def block_matmul(self, x, w, bias=None, residual=None):
        self.calls["matmul"] += 1
        self.packed += isinstance(w, Packed)
        y = dense(w, x) if bias is None else dense(w, x) + bias
        if residual is not None:
            self.calls["residual"] += 1
            y = residual + y
        return y

    def block_matmuls(self, x, ws, norm=None):
        self.calls["qkv"] += 1
        x = _normed(self.calls, x, norm)
        self.packed += sum(isinstance(w, Packed) for w in ws)
        return [dense(w, x) for w in ws]

    def block_swiglu(self, x, g, u, norm=None):
        self.calls["swiglu"] += 1
        x = _normed(self.calls, x, norm)
        self.packed += isinstance(g, Packed) + isinstance(u, Packed)
        return nn.silu(dense(g, x)) * dense(u, x)

    def attention_applies(self, p, x, cache):
        return (
            p is not None
            and isinstance(cache, BucketKVCache)
            and cache.bucketed(x.shape[1])
            and cache.keys is not None
            and x.shape[0] == 1
        )

    def norm_rope(self, q, k, v, qn, kn, off, p):
        self.calls["flash"] += 1
        B, L, _ = q.shape
        q = q.reshape(B, L, p.heads, -1)
        k = k.reshape(B, L, p.kv_heads, -1)
        v = v.reshape(B, L, p.kv_heads, -1).transpose(0, 2, 1, 3)
        if p.eps is not None:
            q, k = mx.fast.rms_norm(q, qn, p.eps), mx.fast.rms_norm(k, kn, p.eps)

        def rope(x):
            x = x.transpose(0, 2, 1, 3)
            return mx.fast.rope(
                x,
                p.head_dim,
                traditional=False,
                base=p.base,
                scale=p.rope_scale,
                offset=off[0],
            )

        return rope(q), rope(k), v

    def delta_conv_applies(self, layer, conv_in, state, mask):
        return mask is None and type(innermost(layer.conv1d)) is nn.Conv1d

    def gated_delta_conv(self, layer, conv_in, a, b, state, step_states=False):
        """The stock ops from the conv input on (GatedDeltaNet.__call__), and
        with `step_states` the state after each step, one step at a time."""
        self.calls["delta_conv"] += 1
        q, k, v = recurrence_inputs(layer, nn.silu(innermost(layer.conv1d)(conv_in)))
        args = (layer.A_log, layer.dt_bias)
        if not step_states:
            return gated_delta_update(q, k, v, a, b, *args, state, use_kernel=False)
        ys, states = [], []
        for t in range(q.shape[1]):
            s = slice(t, t + 1)
            y, state = gated_delta_update(
                q[:, s], k[:, s], v[:, s], a[:, s], b[:, s], *args, state, use_kernel=False
            )
            ys.append(y)
            states.append(state)
        return mx.concatenate(ys, axis=1), state, mx.stack(states)

    def attention(self, q, keys, values, off, scale, causal=True):
        # The whole buffer, masked to what the kernel reads.
        L, C = q.shape[2], keys.shape[2]
        if causal:
            mask = mx.arange(C)[None] <= (off[0] + mx.arange(L))[:, None]
        else:
            mask = mx.broadcast_to(mx.arange(C)[None] < off[0] + L, (L, C))
        out = mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=scale, mask=mask
        )
        return out.transpose(0, 2, 1, 3).reshape(1, L, -1)


@pytest.fixture
def kernel_as_ops():
    """The block path with the backend faked at its one seam."""
    return BlockPath.choose(OpsKernels())


# The fused launches each family's layers take: whole layers where every product
# is bias-free; qwen2 (q/k/v biases) only gate/up; qwen3_5 (gated attention,
# GatedDeltaNet) its dense MLPs, each GatedDeltaNet's four input
# projections in one (multi-weight, "qkv") launch, its layers' norms and
# residual adds folded into those launches, and everything from a
# GatedDeltaNet's conv input to its recurrence in one ("delta_conv"); qwen3_moe (MoE MLPs) only q/k/v. flash.py's
# attention wherever attention.py mirrors the attention layer.
FUSED = {
    "llama": {"norm", "residual", "qkv", "swiglu", "flash"},
    "qwen3": {"norm", "residual", "qkv", "swiglu", "flash"},
    "qwen2": {"swiglu", "flash"},
    # Its decoder layers fold their norms and residual adds (HybridBlockLayer).
    "qwen3_5": {"norm", "residual", "swiglu", "qkv", "delta_conv"},
    "qwen3_moe": {"qkv", "flash"},
}


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_hybrid_layers_fold_norms_and_residuals_exactly(kernel_as_ops, family):
    """A Qwen3.5 block through `HybridBlockLayer` (norm1 in the GatedDeltaNet's
    projection launch or the gated attention's q/k/v launch, the residual in
    out_proj's or o_proj's, norm2 and the residual in a dense MLP's two
    launches): the same logits and caches as the stock layers, fp32, prefill
    then a verify-sized block; an MoE MLP stays stock."""
    model = tiny_model(family)
    stock, folded = Target(model, block_path=BlockPath.choose(None)), Target(
        model, block_path=kernel_as_ops
    )
    caches = [stock.make_cache(), folded.make_cache()]
    for tokens in (mx.arange(3, 40)[None], mx.arange(50, 66)[None]):
        (a, _), (b, _) = [t.forward(tokens, c) for t, c in zip((stock, folded), caches)]
        assert np.array_equal(np.array(a), np.array(b))
    states = [tree_flatten([c.state for c in cache]) for cache in caches]
    assert len(states[0]) == len(states[1]) > 0
    for (_, x), (_, y) in zip(*states):
        assert np.array_equal(np.array(x), np.array(y))
    calls = kernel_as_ops.ops.calls
    gdn_layers = sum(k.mixer == "gated_delta" for k in folded.kinds)
    dense_mlps = 0 if family.endswith("moe") else folded.num_layers
    # Two forwards: each mixer's input norm (GatedDeltaNet or gated attention)
    # and each dense MLP's norm; the residuals of out_proj / o_proj and down_proj.
    folds = folded.num_layers + dense_mlps
    assert calls["norm"] == 2 * folds
    assert calls["residual"] == 2 * folds
    # Each GatedDeltaNet's conv, norms, gates and recurrence: one launch.
    assert calls["delta_conv"] == 2 * gdn_layers


@pytest.mark.parametrize("family", list(FUSED))
@pytest.mark.parametrize("kind", ["oracle", "dflash"])
def test_greedy_through_block_wrappers_equals_stock(kernel_as_ops, family, kind):
    """fp32, partial acceptances throughout: the wrappers mirror the stock
    layers of attention, hybrid (Hv != Hk) and MoE targets."""
    from helpers import N, make_drafter, run, setup

    model, ref = setup(family)
    target = Target(model, block_path=kernel_as_ops)
    drafter = make_drafter(kind, target, ref)
    out, stats = run(
        target,
        drafter,
        cache=target.make_cache(bucket=True),
        max_tokens=N,
        block_size=16,
        prefill_step_size=5,
    )
    assert out == ref and stats.cycles > 0
    calls = kernel_as_ops.ops.calls
    assert calls["matmul"] > 0  # o/down projections, the head, the draft
    # The DFlash draft's own layers take every fused launch.
    fused = FUSED[family] | (FUSED["qwen3"] if kind == "dflash" else set())
    for launch in ("norm", "residual", "qkv", "swiglu", "flash", "delta_conv"):
        assert (calls[launch] > 0) == (launch in fused), launch
    whole = "norm" in FUSED[family]
    assert len(target.fitting.layers) == (target.num_layers if whole else 0)
    assert all(type(l) is nn.Linear for l in plain_linears(model))
    assert not any(isinstance(l, BlockLayer) for l in model.model.layers)
    assert not any(isinstance(m, BlockLinear) for _, m in model.named_modules())


def test_wide_blocks_of_large_weights_take_the_stock_mlp(kernel_as_ops, monkeypatch):
    """Above two row tiles a dense launch of more than `STOCK_ELEMENTS` weight
    elements takes stock's matmul (cuBLAS streams those faster on the H200):
    39- and 48-row blocks keep their q/k/v and o launches, runs the MLP as the stock
    layer does, and gives the stock forward's logits and cache exactly."""
    from mlx_dflash.kernels import matmul

    model = tiny_model("qwen3")
    a = model.model.layers[0].self_attn
    qkv = sum(math.prod(a[n].weight.shape) for n in ("q_proj", "k_proj", "v_proj"))
    mlp = model.model.layers[0].mlp
    assert 2 * math.prod(mlp.gate_proj.weight.shape) > qkv  # the MLP is "large"
    monkeypatch.setattr(matmul, "STOCK_ELEMENTS", qkv)
    prompt, wide = mx.array([list(range(1, 40))]), mx.array([list(range(5, 53))])
    out = []
    for path in (kernel_as_ops, BlockPath.choose(None)):
        target = Target(model, block_path=path)
        cache = [BucketKVCache() for _ in range(target.num_layers)]
        target.forward(prompt, cache)
        out.append((target.forward(wide, cache)[0], cache))
    calls = kernel_as_ops.ops.calls
    layers = len(model.model.layers)
    # Both blocks (39 and 48 rows) are wide: q/k/v and o launches, no SwiGLU.
    assert calls["qkv"] == calls["residual"] == 2 * layers and calls["swiglu"] == 0
    (l1, c1), (l2, c2) = out
    assert mx.array_equal(l1, l2).item()
    for x, y in zip(c1, c2):
        assert x.offset == y.offset and mx.array_equal(x.keys, y.keys).item()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_block_layers_keep_taps_and_cache(kernel_as_ops, family):
    """A verify block through BlockLayer gives the stock forward's logits, tapped
    features and cache contents (taps wrap the layer wrapper during forward)."""
    model = tiny_model(family)
    prompt, block = mx.array([list(range(1, 40))]), mx.array([list(range(5, 21))])
    out = []
    for on in (True, False):
        target = Target(
            model,
            capture_layers=[0, 2],
            block_path=kernel_as_ops,
            block_linear=on,
            attention_kernel=on,
        )
        cache = [BucketKVCache() for _ in range(target.num_layers)]
        target.forward(prompt, cache)
        out.append((*target.forward(block, cache), cache))
    (l1, f1, c1), (l2, f2, c2) = out
    calls = kernel_as_ops.ops.calls
    assert calls["residual"] > 0 and calls["flash"] > 0
    assert mx.array_equal(l1, l2).item() and mx.array_equal(f1, f2).item()
    for a, b in zip(c1, c2):
        assert a.offset == b.offset and mx.array_equal(a.keys, b.keys).item()


def test_draft_blocks_through_kernels_match_ops(kernel_as_ops):
    """A DFlash draft's block through the fused layers and flash.py's
    non-causal attention (its keys past the context, overwritten by the next
    commit) gives the ops path's logits, before and after a commit."""
    from helpers import random_dflash, setup

    model, _ = setup("qwen3")
    target = Target(model, block_path=kernel_as_ops)
    drafter = random_dflash(target)
    assert drafter.fitting.layers  # whole layers in fused launches
    ops_path = target.path.but(attention=False).fit_draft(drafter.draft)
    kernels = drafter.fitting
    cache = target.make_cache(bucket=True)
    tokens = list(range(3, 40))
    drafter.start(tokens)
    for chunk in (tokens[:30], tokens[30:]):
        _, features = target.forward(mx.array([chunk]), cache)
        drafter.commit(chunk, features)
        offsets = [c.offset for c in drafter.cache]
        out = []
        for on in (True, False):
            drafter.fitting = kernels if on else ops_path
            out.append(drafter._logits(chunk[-1], 15))
        assert [c.offset for c in drafter.cache] == offsets
        assert mx.allclose(out[0], out[1], atol=1e-5).item()
        drafter.fitting = kernels
        drafter._logits(chunk[-1], 15)  # leaves its keys past the context
    assert kernel_as_ops.ops.calls["flash"] > 0


def test_batched_draft_blocks_through_kernels_match_each_rows_own(kernel_as_ops):
    """Several rows' draft blocks in one forward (batch.py's `prefetch`) take
    the fused layer launches around the draft's own attention ops (flash.py's
    is one-row) and give each row the logits of its own block."""
    from helpers import random_dflash, setup

    from mlx_dflash.decode import prefill
    from mlx_dflash.drafters import DFlashDrafter, prefetch

    model, _ = setup("qwen3")
    target = Target(model, block_path=kernel_as_ops)
    draft = random_dflash(target).draft
    rows = []
    for i, n_ctx in enumerate((12, 30, 7)):
        d = DFlashDrafter(draft, target)
        tokens = list(range(3 + i, 3 + i + n_ctx))
        prefill(target, target.make_cache(), d, tokens)
        rows.append((d, tokens[-1], 15 - 4 * i))
    own = [d._logits(a, n) for d, a, n in rows]
    calls = kernel_as_ops.ops.calls
    qkv, flash = calls["qkv"], calls["flash"]
    prefetch(*zip(*rows))
    assert calls["qkv"] > qkv and calls["flash"] == flash
    for (d, a, n), o in zip(rows, own):
        assert mx.allclose(d._logits(a, n), o, atol=1e-5).item()


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5"])
def test_quantized_targets_take_the_block_wrappers(kernel_as_ops, family):
    """A 4-bit target (mlx.nn.quantize, affine) through the wrappers with the
    kernels' contract as ops gives stock greedy tokens; its quantized
    products reach the backend as `Packed` weights, fused like bf16 ones."""
    from helpers import PROMPT, N, make_drafter, run
    from mlx_lm.generate import generate_step as stock_generate_step

    model = tiny_model(family)
    nn.quantize(model, group_size=32, bits=4)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
    target = Target(model, block_path=kernel_as_ops)
    drafter = make_drafter("oracle", target, ref)
    out, stats = run(target, drafter, cache=target.make_cache(bucket=True),
                     max_tokens=N, block_size=16, prefill_step_size=5)
    assert out == ref and stats.cycles > 0
    ops = kernel_as_ops.ops
    assert ops.packed > 0
    fused = FUSED[family]
    for launch in ("norm", "residual", "qkv", "swiglu"):
        assert (ops.calls[launch] > 0) == (launch in fused), launch
    assert all(type(l) is nn.QuantizedLinear for l in plain_linears(model))


def test_wide_blocks_tile_wider_and_give_large_products_to_stock():
    """The tiling by rows (H200 sweep, bench/results/h200-probe-linear-rows-bits.jsonl):
    one row tile 16 columns (16 warps where K allows), two 32 x 4, more 32 x 8
    (16 columns where an output is not a multiple of 32; packed weights keep
    16 x 8, 4-bit ones at one row tile by width); and above 32 rows a dense
    launch of more than STOCK_ELEMENTS weight elements is stock's (cuBLAS), a
    packed one still the kernel's."""
    assert tiling(16, 4096) == (16, 16) and tiling(16, 512) == (16, 8)
    assert tiling(32, 4096, None, (6144,)) == (32, 4)
    assert tiling(64, 4096, None, (4096, 1024)) == (32, 8)
    assert tiling(64, 4096, None, (4096, 48)) == (16, 8)
    assert tiling(64, 4096, 4, (4096,)) == (16, 8) and tiling(17, 4096, 4) == (16, 8)
    assert tiling(16, 4096, 8) == (16, 8)
    # 4-bit, one row tile, by width (h100-ncu-linear4-tilings-s39.csv): q/k/v, o and down
    # 8 warps, gate/up 4, the head 64 columns (16 where its rows do not divide by 64)
    assert tiling(16, 4096, 4, (4096, 1024, 1024)) == (16, 8) == tiling(16, 12288, 4, (4096,))
    assert tiling(16, 4096, 4, (12288, 12288)) == (16, 4)
    assert tiling(16, 4096, 4, (151936,)) == (64, 4) and tiling(16, 4096, 4, (151920,)) == (16, 4)
    qkv = [mx.zeros((n, 4096)) for n in (4096, 1024, 1024)]
    gate_up = [mx.zeros((12288, 4096))] * 2
    assert rows_fit(64, *qkv) and rows_fit(32, *gate_up) and not rows_fit(33, *gate_up)
    assert rows_fit(64, _packed(12288, 4096, 4, 64, mx.float32))


def test_packed_group_128_launches_take_at_most_two_row_tiles():
    """The rows a launch takes: 2-64, and 2-32 with group-128 packed weights
    (they failed to launch at 64 rows on the H200)."""
    dense_w = mx.zeros((32, 64))
    g64, g128 = (_packed(32, 256, 4, g, mx.float32) for g in (64, 128))
    assert rows_fit(64, dense_w) and rows_fit(64, g64) and not rows_fit(65, g64)
    assert rows_fit(32, g128) and not rows_fit(33, g128)
    assert not rows_fit(48, dense_w, g128) and not rows_fit(1, dense_w)


def _packed(n, k, bits, group, dtype, seed=0):
    mx.random.seed(seed)
    w = (mx.random.normal((n, k)) * k**-0.5).astype(dtype)
    q, s, b = mx.quantize(w, group_size=group, bits=bits)
    return Packed(q, s, b, group, bits)


@on_cuda
@pytest.mark.parametrize("rows", [2, 17, 64])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("n,k", [(48, 512), (4096, 4096)])
def test_quantized_kernel_matches_quantized_matmul(rows, bits, group, n, k):
    x = mx.random.normal((1, rows, k)).astype(mx.bfloat16)
    w = _packed(n, k, bits, group, mx.bfloat16, seed=rows + n)
    if not rows_fit(rows, w):  # group 128 above 32 rows: stock's (matmul.py)
        assert not applies(x, w)
        return
    assert applies(x, w)
    got = block_matmul(x, w).astype(mx.float32)
    ref = mx.quantized_matmul(
        x.astype(mx.float32), w.weight, w.scales.astype(mx.float32),
        w.biases.astype(mx.float32), True, group, bits,
    )
    err = np.abs(np.array(got) - np.array(ref))
    assert err.max() < 3e-2, err.max()  # bf16 rounding of |y| ~ 1


@on_cuda
@pytest.mark.parametrize("packed", [False, True])
def test_four_weight_launch_matches_stock(packed):
    """A GatedDeltaNet's four input projections (qkv, z, b, a: unequal widths,
    kernels/gdn.py) in one launch, dense and 4-bit."""
    k, ns = 1024, (384, 256, 32, 32)
    x = mx.random.normal((1, 16, k)).astype(mx.bfloat16)
    ws = [
        _packed(n, k, 4, 64, mx.bfloat16, seed=i)
        if packed
        else (mx.random.normal((n, k)) * k**-0.5).astype(mx.bfloat16)
        for i, n in enumerate(ns)
    ]
    assert applies(x, *ws)
    for got, w in zip(block_matmuls(x, ws), ws):
        err = np.abs(np.array(got.astype(mx.float32) - dense(w, x).astype(mx.float32)))
        assert err.max() < 5e-2, err.max()
    # With the decoder layer's input norm folded in (layer.py's HybridBlockLayer).
    nw = (1 + 0.1 * mx.random.normal((k,))).astype(mx.bfloat16)
    xn = mx.fast.rms_norm(x, nw, 1e-6)
    for got, w in zip(block_matmuls(x, ws, norm=(nw, 1e-6)), ws):
        err = np.abs(np.array(got.astype(mx.float32) - dense(w, xn).astype(mx.float32)))
        assert err.max() < 5e-2, err.max()


@on_cuda
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_fused_launches_match_stock(bits):
    k, n = 1024, 2048
    x = mx.random.normal((1, 16, k)).astype(mx.bfloat16)
    ws = [_packed(n, k, bits, 64, mx.bfloat16, seed=i) for i in range(3)]
    nw = (1 + 0.1 * mx.random.normal((k,))).astype(mx.bfloat16)

    def close(got, ref):
        # bf16 outputs: a few units in the last place of each value (the stock
        # SwiGLU rounds gate, up and silu separately; h200-cuda-tests.log saw
        # 0.0625 at a value of 3.8 with an absolute bound)
        got, ref = np.array(got.astype(mx.float32)), np.array(ref.astype(mx.float32))
        excess = np.abs(got - ref) - (5e-2 + 2e-2 * np.abs(ref))
        assert excess.max() <= 0, excess.max()

    xn = mx.fast.rms_norm(x, nw, 1e-6)
    for got, w in zip(block_matmuls(x, ws, norm=(nw, 1e-6)), ws):
        close(got, dense(w, xn))
    close(block_swiglu(x, ws[0], ws[1]), nn.silu(dense(ws[0], x)) * dense(ws[1], x))
    wd = _packed(k, n, bits, 64, mx.bfloat16, seed=5)
    h = mx.random.normal((1, 16, n)).astype(mx.bfloat16)
    close(block_matmul(h, wd, residual=x), x + dense(wd, h))
    # One launch takes one kind of weight: dense and packed do not mix.
    assert not applies(x, ws[0], mx.zeros((n, k), mx.bfloat16))


def test_probe_variants_each_build_their_own_kernel(monkeypatch):
    """bench/probes/probe_linear_variants.py times kernel-text variants in one
    process. matmul._plan keeps each kind of launch's kernel, so a variant
    that did not clear it ran the first variant's kernel (every multi-variant
    run from 79244f7 on). Each variant's launch must carry its own text."""
    import sys
    from pathlib import Path

    from mlx_dflash.kernels import matmul

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench" / "probes"))
    plv = __import__("probe_linear_variants")
    built = []

    def build(**kw):  # stands in for mx.fast.cuda_kernel (no GPU here)
        built.append(kw["source"])
        return lambda **call: [mx.zeros(s, d) for s, d in zip(call["output_shapes"], call["output_dtypes"])]

    # use_variant routes every build through plv._original; it also replaces
    # mx.fast.cuda_kernel, which monkeypatch puts back after the test.
    monkeypatch.setattr(plv, "_original", build)
    monkeypatch.setattr(mx.fast, "cuda_kernel", build)
    w = Packed(*mx.quantize(mx.zeros((64, 256), mx.bfloat16), group_size=64, bits=4), 64, 4)
    x = mx.zeros((16, 256), mx.bfloat16)
    marks = {"base": "__byte_perm", "shift4": "(t << 12)", "u8": "#pragma unroll 8", "wide4p": "16 * u",
             "late4": "bw[0]"}
    try:
        for name, mark in marks.items():
            plv.use_variant(name)
            built.clear()
            matmul._launch(x, [w], cols=16, warps=4)
            assert len(built) == 1 and mark in built[0], name
    finally:
        plv.use_variant("base")
        matmul._plan.cache_clear()
        sys.modules.pop("probe_linear_variants", None)


def test_with_variant_routes_only_4bit_launches(monkeypatch):
    """bench/probes/with_variant.py runs a whole command (the bench, a draft
    pass) with a 4-bit variant and tiling: 4-bit launches of one row tile take
    both, every other launch the shipped text and tiling."""
    import sys
    from pathlib import Path

    from mlx_dflash.kernels import matmul

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench" / "probes"))
    plv = __import__("probe_linear_variants")
    wv = __import__("with_variant")
    built, grids = [], []

    def build(**kw):  # stands in for mx.fast.cuda_kernel (no GPU here)
        built.append(kw["source"])

        def run(**call):
            grids.append(call["grid"][0])
            return [mx.zeros(s, d) for s, d in zip(call["output_shapes"], call["output_dtypes"])]

        return run

    monkeypatch.setattr(plv, "_original", build)
    monkeypatch.setattr(mx.fast, "cuda_kernel", build)
    monkeypatch.setattr(matmul, "_kernel", matmul._kernel)  # install replaces these two
    monkeypatch.setattr(matmul, "tiling", matmul.tiling)
    k, n = 1024, 64
    w4 = Packed(*mx.quantize(mx.zeros((n, k), mx.bfloat16), group_size=64, bits=4), 64, 4)
    w8 = Packed(*mx.quantize(mx.zeros((n, k), mx.bfloat16), group_size=64, bits=8), 64, 8)
    wd = mx.zeros((n, k), mx.bfloat16)
    x = mx.zeros((16, k), mx.bfloat16)
    try:
        wv.install("late4", "32x4")
        for w in (w4, w8, wd):
            matmul._launch(x, [w])
        late, eight, dense = built
        assert "bw[0]" in late and "bw[0]" not in eight + dense
        assert "__byte_perm" not in eight and "wv[p][j][0] = q[0]" in dense
        # 4-bit: 64 / 32 column blocks of 4 warps; the others as matmul.py tiles them
        auto8, autod = matmul.tiling(16, k, 8, (n,)), matmul.tiling(16, k, None, (n,))
        assert auto8 != (32, 4) and autod != (32, 4)
        assert grids == [2 * 32 * 4, n // auto8[0] * 32 * auto8[1], n // autod[0] * 32 * autod[1]]
    finally:
        plv.use_variant("base")
        matmul._kernels.clear()
        matmul._plan.cache_clear()
        sys.modules.pop("probe_linear_variants", None)
        sys.modules.pop("with_variant", None)
