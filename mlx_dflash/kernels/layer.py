"""Decoder layers for verify and draft blocks in four kernel launches (CUDA).

A verify is host-bound on MLX CUDA: every graph node costs ~9 µs to build and
encode (bench/results/speed.md §9). For the decoder layers whose forward this
mirrors line for line (mlx_lm's llama / qwen2 / qwen3 `TransformerBlock`:
`h = x + attn(norm1(x))`, `out = h + mlp(norm2(h))`), a block of 2-64 rows
takes four launches of the matmul.py kernel: RMSNorm + q/k/v, o_proj + the
residual, RMSNorm + gate/up/SwiGLU, down_proj + the residual; the attention
between them is flash.py's where it applies, else attention.py's. `BlockLayer`
wraps a target's layer instance and `DraftBlockLayer` a DFlash draft's; the
block path (path.py) puts them on only for the duration of a forward, and
every other call goes to the stock layer. The launches go through the backend
(`ops`, cuda.py's).
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention

from ..wrapper import Wrapper, class_name
from . import flash
from .attention import MIRRORED, attend, is_block
from .gdn import BlockDelta
from .linear import MIRRORED_MLP, fusable, stock
from .matmul import MAX_ROWS, Fits, block_of, weight_of

MIRRORED_LAYERS = {
    "mlx_lm.models.llama.TransformerBlock",
    "mlx_lm.models.qwen2.TransformerBlock",
    "mlx_lm.models.qwen3.TransformerBlock",
}
# Decoder layers `h = x + mixer(norm1(x)); out = h + mlp(norm2(h))` whose mixer
# is a GatedDeltaNet (`is_linear`) or an attention layer (HybridBlockLayer).
HYBRID_LAYERS = {"mlx_lm.models.qwen3_5.DecoderLayer"}
# Its attention layers: q (with an output gate), k, v, per-head norms, partial
# RoPE, `o_proj(attention * sigmoid(gate))` (`gated_attention` mirrors it).
GATED_ATTENTION = {"mlx_lm.models.qwen3_next.Qwen3NextAttention"}


class BlockLayer(Wrapper):
    """Wraps one mirrored decoder layer instance (see module docstring)."""

    def __init__(self, inner: nn.Module, from_keys: float, ops, kernel: bool = False):
        super().__init__(inner)
        self.from_keys = from_keys
        self.ops = ops
        # flash.py's attention (its Params), or None
        self.kernel = flash.params(inner.self_attn) if kernel else None
        self.fits, self.mlp_fits = Fits(), Fits()

    def __call__(self, x: mx.array, mask=None, cache=None):
        l, ops = self.inner, self.ops
        if not (is_block(x, cache) and self.fits(x, lambda: fits(ops, l, x))):
            return l(x, mask, cache)
        mlp = self.mlp_fits(x, lambda: mlp_fits(ops, l["mlp"], x))

        def attention(q, k, v):
            p = self.kernel
            if p is not None and ops.attention_applies(p, q, cache):
                return ops.attend(p, q, k, v, cache, qk_norms(l))
            return attend(l["self_attn"], q, k, v, mask, cache, self.from_keys)

        return fused(ops, l, x, attention, mlp)


class DraftBlockLayer(Wrapper):
    """Wraps one DFlash `DraftLayer` instance: a draft block whose layer fits
    takes the four launches around flash.py's non-causal (or causal)
    attention (the block's keys go past the context, where the next commit
    writes), or around the draft's own attention ops where flash.py's does
    not apply (several rows, a sliding window). Every other call runs the
    stock layer."""

    def __init__(self, inner: nn.Module, ops):
        super().__init__(inner)
        self.ops = ops
        self.params = flash.params(inner.self_attn)  # None: the ops path only
        self.fits, self.mlp_fits = Fits(), Fits()

    def __call__(self, x: mx.array, cache) -> mx.array:
        l, ops, p = self.inner, self.ops, self.params
        a = l["self_attn"]
        if not self.fits(x, lambda: fusable(*linears(l)) and fits(ops, l, x)):
            return l(x, cache)
        mlp = self.mlp_fits(x, lambda: mlp_fits(ops, l["mlp"], x))
        if a.window is None and p is not None and ops.attention_applies(p, x, cache):
            norms = qk_norms(l)

            def attention(q, k, v):
                return ops.attend(p, q, k, v, cache, norms, a.causal, advance=False)

        else:  # several rows (batch.py's), a window, a head size flash lacks

            def attention(q, k, v):
                return a.attend(q, k, v, cache)

        return fused(ops, l, x, attention, mlp)


class HybridBlockLayer(Wrapper):
    """Wraps one mirrored Qwen3.5 decoder layer instance (`HYBRID_LAYERS`):
    for a block of 2-64 rows its norms and residual adds ride in kernel
    launches instead of being graph nodes of their own (a hybrid 9B verify is
    host-bound: bench/results/h200-probe-verify-profile-qwen3_5-9b.txt). A
    GatedDeltaNet mixer (gdn.py's `BlockDelta`) takes norm1 into its input
    projections' launch and the residual into out_proj's, a gated attention
    mixer (`gated_attention`) into its q/k/v and o_proj launches; a mirrored
    MLP is norm2 + gate/up/SwiGLU and down_proj + the residual (two launches).
    Whatever does not fold runs as the stock layer writes it."""

    def __init__(self, inner: nn.Module, ops):
        super().__init__(inner)
        self.ops = ops
        self.mlp_fits = Fits()
        self.attention_fits = Fits()
        mlp = inner.mlp
        self.mlp_folds = class_name(mlp) in MIRRORED_MLP and fusable(
            mlp.gate_proj, mlp.up_proj, mlp.down_proj
        )
        a = None if inner.is_linear else inner.self_attn
        self.attention_folds = (
            a is not None
            and class_name(a) in GATED_ATTENTION
            and fusable(a.q_proj, a.k_proj, a.v_proj, a.o_proj)
        )

    def __call__(self, x: mx.array, mask=None, cache=None):
        l = self.inner
        if not 1 < x.size // x.shape[-1] <= MAX_ROWS:
            return l(x, mask, cache)
        n1, n2 = l["input_layernorm"], l["post_attention_layernorm"]
        mixer = l["linear_attn"] if l.is_linear else l["self_attn"]
        if isinstance(mixer, BlockDelta) and mixer.folds(x, n1, cache):
            h = mixer(x, mask, cache, norm=n1, residual=x)
        elif self.attention_folds and self.attention_fits(
            x, lambda: gated_attention_fits(self.ops, mixer, n1, x)
        ):
            h = gated_attention(self.ops, mixer, x, n1, mask, cache)
        else:
            h = x + mixer(n1(x), mask, cache)
        return self.ffn(h, n2)

    def ffn(self, h: mx.array, norm: nn.RMSNorm) -> mx.array:
        """`h + mlp(norm(h))`, in two launches where they take h."""
        mlp, ops = self.inner["mlp"], self.ops
        if self.mlp_folds and self.mlp_fits(
            h, lambda: norm["weight"].dtype == h.dtype and mlp_fits(ops, mlp, h)
        ):
            gate, up, down = [weight_of(stock(mlp[n])) for n in _MLP]
            m = ops.block_swiglu(h, gate, up, norm=(norm["weight"], norm.eps))
            return ops.block_matmul(m, down, residual=h)
        return h + mlp(norm(h))


def gated_attention_fits(ops, a: nn.Module, norm: nn.RMSNorm, x: mx.array) -> bool:
    """Whether `gated_attention` takes block `x` in its two launches."""
    return norm["weight"].dtype == x.dtype and attention_fits(ops, a, x)


def gated_attention(ops, a: nn.Module, x: mx.array, norm: nn.RMSNorm, mask, cache):
    """`x + a(norm(x))` for a `GATED_ATTENTION` layer `a`: norm + q/k/v in one
    launch, o_proj + the residual in another; between them the stock layer's
    own ops (Qwen3NextAttention.__call__ of the pinned mlx_lm minor)."""
    B, L, _ = x.shape
    wq, wk, wv, wo = [weight_of(stock(a[n])) for n in _PROJ]
    q, keys, values = ops.block_matmuls(x, [wq, wk, wv], norm=(norm["weight"], norm.eps))
    queries, gate = mx.split(q.reshape(B, L, a.num_attention_heads, -1), 2, axis=-1)
    gate = gate.reshape(B, L, -1)
    queries = a.q_norm(queries).transpose(0, 2, 1, 3)
    keys = a.k_norm(keys.reshape(B, L, a.num_key_value_heads, -1)).transpose(0, 2, 1, 3)
    values = values.reshape(B, L, a.num_key_value_heads, -1).transpose(0, 2, 1, 3)
    if cache is not None:
        queries = a.rope(queries, offset=cache.offset)
        keys = a.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
    else:
        queries, keys = a.rope(queries), a.rope(keys)
    out = scaled_dot_product_attention(
        queries, keys, values, cache=cache, scale=a.scale, mask=mask
    )
    out = out.transpose(0, 2, 1, 3).reshape(B, L, -1)
    return ops.block_matmul(out * mx.sigmoid(gate), wo, residual=x)


def wrap_hybrid(layer, ops) -> Optional[HybridBlockLayer]:
    """A `HybridBlockLayer` around `layer` if its class is mirrored and its
    norms are RMSNorms, else None."""
    if class_name(layer) not in HYBRID_LAYERS:
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if any(type(n) is not nn.RMSNorm for n in norms):
        return None
    return HybridBlockLayer(layer, ops)


# nn.Module attribute access costs ~1 µs per level (a failed normal lookup,
# then the dict), and a verify reads 11 weights in each of 36 layers: these
# read them with dict lookups, through the live module tree every call.
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def linears(l: nn.Module):
    """Layer `l`'s [q, k, v, o, gate, up, down] projection modules (the stock
    ones where a `BlockLinear` wraps them)."""
    a, mlp = l["self_attn"], l["mlp"]
    return [stock(a[n]) for n in _PROJ] + [stock(mlp[n]) for n in _MLP]


def _parts(l: nn.Module):
    """[q, k, v, o, gate, up, down] weights and the two norms of layer `l`."""
    ws = [weight_of(m) for m in linears(l)]
    return ws, l["input_layernorm"], l["post_attention_layernorm"]


def qk_norms(l: nn.Module):
    """The per-head q/k norm weights of `l`'s attention, or None."""
    a = l["self_attn"]
    return (a["q_norm"]["weight"], a["k_norm"]["weight"]) if "q_norm" in a else None


def fits(ops, l: nn.Module, x: mx.array) -> bool:
    """Whether decoder layer `l` (self_attn with q/k/v/o_proj, mlp with
    gate/up/down_proj, input and post-attention RMSNorms) takes block `x` in
    `fused`'s launches of the backend `ops`: its attention half's two
    (`mlp_fits` says whether the MLP's two run too)."""
    n1, n2 = l["input_layernorm"], l["post_attention_layernorm"]
    return (
        n1["weight"].dtype == n2["weight"].dtype == x.dtype
        and attention_fits(ops, l["self_attn"], x)
    )


def attention_fits(ops, a: nn.Module, x: mx.array) -> bool:
    """Whether attention layer `a`'s q/k/v take block `x` in one launch and
    its o_proj in another."""
    wq, wk, wv, wo = [weight_of(stock(a[n])) for n in _PROJ]
    return ops.applies(x, wq, wk, wv) and ops.applies(block_of(x, wo), wo)


def mlp_fits(ops, mlp: nn.Module, h: mx.array) -> bool:
    """Whether MLP `mlp` (gate/up/down_proj) takes block `h` in two launches
    (a wide block of large weights takes stock's matmul instead: matmul.py's
    `rows_fit`)."""
    gate, up, down = [weight_of(stock(mlp[n])) for n in _MLP]
    return (
        gate.shape == up.shape
        and ops.applies(h, gate, up)
        and ops.applies(block_of(h, down), down)
    )


def fused(ops, l: nn.Module, x: mx.array, attention, mlp: bool = True) -> mx.array:
    """`l`'s forward of block `x` in four launches around `attention(q, k, v)`,
    which returns o_proj's input; with `mlp` False, the MLP as the stock
    layer writes it."""
    (q, k, v, o, gate, up, down), n1, n2 = _parts(l)
    q, k, v = ops.block_matmuls(x, [q, k, v], norm=(n1["weight"], n1.eps))
    h = ops.block_matmul(attention(q, k, v), o, residual=x)
    if not mlp:
        return h + l["mlp"](n2(h))
    m = ops.block_swiglu(h, gate, up, norm=(n2["weight"], n2.eps))
    return ops.block_matmul(m, down, residual=h)


def wrap_layer(
    layer, from_keys: float, ops, kernel: bool = False
) -> Optional[BlockLayer]:
    """A `BlockLayer` around `layer` if its class and parts are mirrored and
    every product is a plain or quantized Linear without a bias, else None."""
    if class_name(layer) not in MIRRORED_LAYERS:
        return None
    a, mlp = layer.self_attn, layer.mlp
    if class_name(a) not in MIRRORED or class_name(mlp) not in MIRRORED_MLP:
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if any(type(n) is not nn.RMSNorm for n in norms):
        return None
    projections = [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
    projections += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not fusable(*projections):
        return None
    return BlockLayer(layer, from_keys, ops, kernel)
