"""flash.py's kernels (CUDA only): per-head norms + RoPE equal the stock ops,
the split-K attention equals an fp32 softmax attention over the valid keys, and
a bf16 target's verify logits are the same with and without them. Off CUDA the
wiring is covered by tests/test_linear.py's `kernel_as_ops` fixture."""

import math

import mlx.core as mx
import numpy as np
import pytest
from helpers import on_cuda
from mlx_lm.models import llama, qwen3
from models import kernel_model

from mlx_dflash.kernels import flash, rope
from mlx_dflash.kernels.cuda import CudaKernels
from mlx_dflash.cache import BucketKVCache
from mlx_dflash.target import Target


def attention_layer(family, heads, kv_heads, head_dim, dtype):
    cls, args = {
        "qwen3": (qwen3, dict(rms_norm_eps=1e-6, rope_theta=1e6)),
        "llama": (llama, dict(rms_norm_eps=1e-5, rope_theta=5e5)),
    }[family]
    a = cls.Attention(
        cls.ModelArgs(
            model_type=family,
            hidden_size=heads * head_dim,
            num_hidden_layers=1,
            intermediate_size=64,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=64,
            max_position_embeddings=65536,
            tie_word_embeddings=True,
            **args,
        )
    )
    a.set_dtype(dtype)
    if "q_norm" in a:  # not all ones, so that the weight's rounding shows
        a.q_norm.weight = (1 + 0.3 * mx.random.normal((head_dim,))).astype(dtype)
        a.k_norm.weight = (1 + 0.3 * mx.random.normal((head_dim,))).astype(dtype)
    return a


def stock_norm_rope(a, q, k, v, offset):
    B, L, _ = q.shape
    q = q.reshape(B, L, a.n_heads, -1)
    k = k.reshape(B, L, a.n_kv_heads, -1)
    v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if "q_norm" in a:
        q, k = a.q_norm(q), a.k_norm(k)
    q = a.rope(q.transpose(0, 2, 1, 3), offset=offset)
    return q, a.rope(k.transpose(0, 2, 1, 3), offset=offset), v


@on_cuda
@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("offset", [0, 1000, 40000])
def test_norm_rope_equals_stock_ops(family, head_dim, offset):
    mx.random.seed(1)
    dtype = mx.bfloat16
    a = attention_layer(family, 8, 2, head_dim, dtype)
    L = 16
    q = mx.random.normal((1, L, 8 * head_dim)).astype(dtype)
    k = (3 * mx.random.normal((1, L, 2 * head_dim))).astype(dtype)
    v = mx.random.normal((1, L, 2 * head_dim)).astype(dtype)
    p = flash.params(a)
    qk = (a.q_norm.weight, a.k_norm.weight) if p.eps is not None else (None, None)
    off = mx.array([offset, 1], mx.int32)
    ours = rope.norm_rope(q, k, v, *qk, off, p)
    ref = stock_norm_rope(a, q, k, v, offset)
    for x, y in zip(ours, ref):
        assert x.shape == y.shape and x.dtype == y.dtype
        x, y = np.array(x.astype(mx.float32)), np.array(y.astype(mx.float32))
        # Same formulas in fp32, each rounded to bf16 where stock rounds: at
        # most one bf16 step apart (cos/sin of large angles may differ by an ulp).
        assert np.abs(x - y).max() <= 2**-7 * np.abs(y).max()
        assert (x == y).mean() > 0.98


def reference_attention(q, keys, values, offset, scale, causal=True):
    """fp32 softmax attention over the first offset + L keys, causal or not."""
    _, H, L, D = q.shape
    Hk = keys.shape[1]
    n = offset + L
    q = q.astype(mx.float32).reshape(1, Hk, H // Hk, L, D)
    k = keys[..., :n, :].astype(mx.float32)[:, :, None]
    v = values[..., :n, :].astype(mx.float32)[:, :, None]
    s = (q @ k.swapaxes(-1, -2)) * scale
    if causal:
        visible = mx.arange(n)[None] <= mx.arange(offset, n)[:, None]
        s = mx.where(visible, s, -mx.inf)
    out = mx.softmax(s, axis=-1) @ v  # (1, Hk, rep, L, D)
    return out.reshape(1, H, L, D).transpose(0, 2, 1, 3).reshape(1, L, H * D)


@on_cuda
@pytest.mark.parametrize(
    "heads,kv_heads,L",
    [(32, 8, 16), (32, 8, 7), (16, 16, 16), (8, 2, 32), (4, 4, 2), (8, 8, 64)],
)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("offset", [0, 5, 1000, 16384])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_attention_equals_fp32_reference(heads, kv_heads, L, head_dim, offset, dtype):
    mx.random.seed(2)
    cap = -(-(offset + L) // 256) * 256
    q = mx.random.normal((1, heads, L, head_dim)).astype(dtype)
    keys = (2 * mx.random.normal((1, kv_heads, cap, head_dim))).astype(dtype)
    values = mx.random.normal((1, kv_heads, cap, head_dim)).astype(dtype)
    # The padding past offset + L is never read: poison it.
    keys[..., offset + L :, :] = mx.nan
    values[..., offset + L :, :] = mx.nan
    scale = 1 / math.sqrt(head_dim)
    ours = flash.attention(q, keys, values, flash.offsets(offset, keys), scale)
    ref = reference_attention(q, keys, values, offset, scale)
    assert ours.shape == (1, L, heads * head_dim) and ours.dtype == dtype
    err = np.abs(np.array(ours.astype(mx.float32) - ref))
    assert np.isfinite(err).all()
    assert err.max() < 2e-2, err.max()


@on_cuda
def test_attention_with_splits_past_the_keys():
    """Splits follow the buffer's capacity, so most are empty at a small offset."""
    mx.random.seed(3)
    q = mx.random.normal((1, 8, 16, 128)).astype(mx.bfloat16)
    keys = mx.random.normal((1, 2, 4096, 128)).astype(mx.bfloat16)
    values = mx.random.normal((1, 2, 4096, 128)).astype(mx.bfloat16)
    for offset in (0, 40, 300):
        off = flash.offsets(offset, keys)
        assert off[1].item() * flash.CHUNK > offset + 16
        ours = flash.attention(q, keys, values, off, 0.1)
        ref = reference_attention(q, keys, values, offset, 0.1)
        assert np.abs(np.array(ours.astype(mx.float32) - ref)).max() < 2e-2


@on_cuda
@pytest.mark.parametrize("offset", [0, 37, 1000, 16384])
def test_noncausal_attention_equals_fp32_reference(offset):
    """A draft block: every query sees the context and the whole block."""
    mx.random.seed(4)
    heads, kv_heads, L, d = 32, 8, 16, 128
    cap = -(-(offset + L) // 256) * 256
    q = mx.random.normal((1, heads, L, d)).astype(mx.bfloat16)
    keys = (2 * mx.random.normal((1, kv_heads, cap, d))).astype(mx.bfloat16)
    values = mx.random.normal((1, kv_heads, cap, d)).astype(mx.bfloat16)
    keys[..., offset + L :, :] = mx.nan
    values[..., offset + L :, :] = mx.nan
    off = flash.offsets(offset, keys)
    ours = flash.attention(q, keys, values, off, d**-0.5, causal=False)
    ref = reference_attention(q, keys, values, offset, d**-0.5, causal=False)
    assert np.abs(np.array(ours.astype(mx.float32) - ref)).max() < 2e-2


@on_cuda
def test_draft_logits_close_with_and_without_kernels_bf16():
    """A bf16 DFlash draft's block through the fused layers and flash.py's
    non-causal attention: the ops path's logits up to bf16 rounding, before
    and after a commit."""
    from mlx_dflash.draft import DFlashDraft, DraftArgs
    from mlx_dflash.drafters import DFlashDrafter

    mx.random.seed(5)
    target = Target(kernel_model("qwen3"))
    args = DraftArgs(
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        rms_norm_eps=1e-6,
        vocab_size=1024,
        target_layer_ids=[0, 1],
        mask_token_id=1023,
        rope_theta=1e6,
    )
    draft = DFlashDraft(args)
    draft.set_dtype(mx.bfloat16)
    target.set_capture_layers(args.target_layer_ids)
    drafter = DFlashDrafter(draft, target)
    assert drafter.fitting.layers  # whole layers in fused launches
    ops_path = target.path.but(attention=False).fit_draft(draft)
    kernels = drafter.fitting
    cache = target.make_cache(bucket=True)
    tokens = mx.random.randint(0, 1000, (300,)).tolist()
    drafter.start(tokens)
    for chunk in (tokens[:280], tokens[280:]):
        _, features = target.forward(mx.array([chunk]), cache)
        drafter.commit(chunk, features)
        out = []
        for on in (True, False):
            drafter.fitting = kernels if on else ops_path
            out.append(drafter._logits(chunk[-1], 15).astype(mx.float32))
        assert np.abs(np.array(out[0] - out[1])).max() < 0.1
        assert (mx.argmax(out[0], -1) == mx.argmax(out[1], -1)).mean().item() > 0.9
        drafter.fitting = kernels
        drafter._logits(chunk[-1], 15)


def test_splits_cover_every_chunk():
    for n in (1, 17, 64, 65, 1040, 16400, 131072):
        for kv in (1, 2, 8, 32):
            s = flash.splits(n, kv)
            chunks = -(-n // flash.CHUNK)
            per = -(-chunks // s)
            assert 1 <= s <= chunks and (s - 1) * per < chunks <= s * per


@on_cuda
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_verify_logits_close_with_and_without_kernels_bf16(family, monkeypatch):
    """A bf16 target's 16-token verify at ~700 keys: the same logits with
    flash.py's attention as with the ops path, up to bf16 rounding."""
    mx.random.seed(0)
    model = kernel_model(family)
    prompt = mx.random.randint(0, 1024, (1, 700))
    block = mx.random.randint(0, 1024, (1, 16))
    launches = []
    real = flash.attention
    counted = staticmethod(lambda *a: launches.append(1) or real(*a))
    monkeypatch.setattr(CudaKernels, "attention", counted)
    out = []
    for on in (False, True):
        target = Target(model, attention_kernel=on)
        cache = [BucketKVCache() for _ in range(target.num_layers)]
        target.forward(prompt, cache)
        out.append(target.forward(block, cache)[0].astype(mx.float32))
    assert len(launches) == 2  # one per layer, only with the kernels on
    assert np.abs(np.array(out[0] - out[1])).max() < 0.1
    assert (mx.argmax(out[0], -1) == mx.argmax(out[1], -1)).mean().item() > 0.9
