"""Attention for verify- and draft-sized blocks at long context, as plain ops.

On MLX CUDA (0.32), `mx.fast.scaled_dot_product_attention` runs one query on
its vector kernel but sends any block of queries with a mask to cuDNN. For a
16-token verify of a Qwen3-8B shape at 16k context that call makes the forward
22.9 ms; the same attention as two matmuls and a softmax makes it 15.4 ms
(bench/results/speed.md §7; in the bench at 16k, 258 against 227 tok/s). MLX
has no per-call switch (its process-wide one also slows stock decoding and
prefill), so the target's attention layers get a small wrapper on the instance,
put on only inside `Target.forward` (path.py) as the fused GatedDeltaNet is:
for a block of 2-64 queries over at least `from_keys` keys it computes the
layer's attention itself; everything else goes to the stock layer unchanged.
Only layer classes whose forward the wrapper mirrors line for line are wrapped
(`MIRRORED`). The DFlash draft's own attention uses the same fold
(`block_attention`). The fold is plain ops: it needs no backend; the fused
q/k/v launch and flash.py's attention need one (cuda.py's).
"""

import math
from contextlib import contextmanager
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache import MAX_BLOCK, PaddedBatchKVCache
from ..wrapper import Wrapper, class_name, innermost
from . import flash
from .linear import fusable, stock
from .matmul import Fits, weight_of

# Attention classes whose __call__ is: q/k/v projections, optional per-head
# q_norm/k_norm, RoPE at cache.offset, cache update, SDPA, o_proj.
MIRRORED = {
    "mlx_lm.models.llama.Attention",
    "mlx_lm.models.qwen2.Attention",
    "mlx_lm.models.qwen3.Attention",
    "mlx_lm.models.qwen3_moe.Attention",
}



def folded_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, mask):
    """softmax(scale * q k^T, masked) v with the query heads that share a KV head
    stacked on the query axis: one (rep*L x S) product per KV head, K/V read once.

    q: (B, H, L, D); k, v: (B, Hk, S, D); mask: None, or an (L, S) or a
    per-row (B, 1, L, S) array: boolean (True = visible) or additive.
    """
    B, H, L, D = q.shape
    Hk = k.shape[1]
    rep = H // Hk
    s = (q * scale).reshape(B, Hk, rep * L, D) @ k.swapaxes(-1, -2)
    if mask is not None and L > 1:  # row r * L + i of a KV head is query i
        mask = mx.tile(mask, (rep, 1) if mask.ndim == 2 else (1, 1, rep, 1))
    if mask is not None and mask.dtype == mx.bool_:
        s = mx.where(mask, s, mx.finfo(s.dtype).min)
    elif mask is not None:
        s = s + mask
    p = mx.softmax(s, axis=-1, precise=True)
    return (p @ v).reshape(B, H, L, v.shape[-1])


def foldable(q: mx.array, k: mx.array, mask, from_keys: float) -> bool:
    """Whether `folded_attention` takes this call (else MLX's fused one)."""
    L, S = q.shape[2], k.shape[2]
    plain_mask = mask is None or (isinstance(mask, mx.array) and mask.ndim == 2)
    return 1 < L <= MAX_BLOCK and S >= from_keys and plain_mask and q.shape[0] == 1


def block_attention(q, k, v, scale: float, mask, from_keys: float) -> mx.array:
    """`folded_attention` where `foldable`, else MLX's fused attention."""
    if foldable(q, k, mask, from_keys):
        return folded_attention(q, k, v, scale, mask)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def attend(
    a: nn.Module, q, k, v, mask, cache, from_keys: float, ops=None, kernel=None, fold=False
) -> mx.array:
    """Mirrored layer `a`'s attention from its q/k/v projections (B, L, ·) to
    the input of its o_proj: per-head norms, RoPE, cache update, attention.
    With `kernel` (`a`'s `flash.Params`), in the backend `ops`' flash.py
    launches where they apply (the block's mask is then the bucket's causal
    one, which they compute from the cache's offset); with `fold`, always
    `folded_attention`."""
    if kernel is not None and ops.attention_applies(kernel, q, cache):
        norms = (a.q_norm.weight, a.k_norm.weight) if "q_norm" in a else None
        return ops.attend(kernel, q, k, v, cache, norms)
    B, L, _ = q.shape
    q = q.reshape(B, L, a.n_heads, -1)
    k = k.reshape(B, L, a.n_kv_heads, -1)
    v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if "q_norm" in a:
        q, k = a.q_norm(q), a.k_norm(k)
    q = a.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)
    k = a.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    if fold:
        out = folded_attention(q, k, v, a.scale, mask)
    else:
        out = block_attention(q, k, v, a.scale, mask, from_keys)
    return out.transpose(0, 2, 1, 3).reshape(B, L, -1)


def is_block(x: mx.array, cache) -> bool:
    """Whether this call is a verify/draft-sized block over a plain KV cache
    (quantized caches, `bits`, are attended mlx_lm's own way): one row's, or
    several rows' (batch.py's, over a `RaggedKVCache`) of at most MAX_BLOCK
    rows in all, which the matmul launches take as one block of B x L rows
    (flash.py's attention and the fold stay one-row: they check for it)."""
    B, L = x.shape[0], x.shape[1]
    return (
        cache is not None
        and not hasattr(cache, "bits")
        and 1 < L
        and B * L <= MAX_BLOCK
    )


def longest(cache) -> int:
    """The cache's longest row (its `offset` is per row in a batch)."""
    lengths = getattr(cache, "lengths", None)
    return max(lengths) if isinstance(lengths, list) and lengths else int(cache.offset)


class BlockAttention(Wrapper):
    """Wraps one mirrored attention layer instance (see module docstring).

    With the backend `ops` (cuda.py's; None: the fold alone) and `fuse_qkv`,
    a block's q, k and v projections are one launch of the matmul.py kernel
    where it applies; with `kernel` too, the attention between them and
    o_proj is flash.py's.
    """

    def __init__(
        self,
        inner: nn.Module,
        from_keys: float,
        ops=None,
        fuse_qkv: bool = False,
        kernel: bool = False,
    ):
        super().__init__(inner)
        self.from_keys = from_keys
        self.ops = ops
        fuse_qkv = fuse_qkv and ops is not None
        self.fuse_qkv = fuse_qkv and fusable(inner.q_proj, inner.k_proj, inner.v_proj)
        self.kernel = flash.params(inner) if kernel and ops is not None else None
        self.fits = Fits()

    def __call__(self, x: mx.array, mask=None, cache=None):
        a = self.inner
        if not is_block(x, cache):
            return a(x, mask=mask, cache=cache)
        ops = self.ops
        ws = [weight_of(stock(a[n])) for n in ("q_proj", "k_proj", "v_proj")]
        fuse = self.fuse_qkv and self.fits(x, lambda: ops.applies(x, *ws))
        own = self.kernel is not None and ops.attention_applies(self.kernel, x, cache)
        own = own or longest(cache) + x.shape[1] >= self.from_keys
        if not (fuse or own):
            return a(x, mask=mask, cache=cache)
        if fuse:
            q, k, v = ops.block_matmuls(x, ws)
        else:
            q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        out = attend(a, q, k, v, mask, cache, self.from_keys, ops, self.kernel)
        return a.o_proj(out)


def wrap_attention(
    attn, from_keys: float, ops=None, fuse_qkv: bool = False, kernel: bool = False
) -> Optional[BlockAttention]:
    """A `BlockAttention` around `attn` if its class is mirrored, else None."""
    if class_name(attn) not in MIRRORED:
        return None
    return BlockAttention(attn, from_keys, ops, fuse_qkv, kernel)


class FoldedSteps(Wrapper):
    """One mirrored attention instance's one-token steps over a
    `PaddedBatchKVCache` (the training data generator's batched decoding) in
    `folded_attention`: MLX CUDA (0.32) runs a masked one-query attention as a
    batched gemv per query head, reading each KV head's keys once per query
    head sharing them (50 of a 60 ms step of 1024 rows at 768 keys on an H200:
    bench/results/h200-ncu-gen-step.txt). Every other call goes to the layer."""

    def __call__(self, x: mx.array, mask=None, cache=None):
        a = self.inner
        if x.shape[1] != 1 or not isinstance(cache, PaddedBatchKVCache):
            return a(x, mask=mask, cache=cache)
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        return a.o_proj(attend(a, q, k, v, mask, cache, math.inf, fold=True))


@contextmanager
def folded_steps(layers):
    """`FoldedSteps` over the mirrored attention of each of the decoder
    `layers` (under their wrappers) while the block runs."""
    put = []
    for layer in layers:
        inner = innermost(layer)
        attn = inner.get("self_attn", None) if isinstance(inner, dict) else None
        if attn is not None and class_name(attn) in MIRRORED:
            inner["self_attn"] = FoldedSteps(attn)
            put.append((inner, attn))
    try:
        yield
    finally:
        for inner, attn in put:
            inner["self_attn"] = attn
