"""The DFlash training objective: random anchors, one block attention mask, weighted CE.

Every anchor p (a response position) makes a block `[token p, MASK x (B-1)]` at
positions p .. p+B-1. Its queries see the context K/V of positions < p (from the
target's features, as the draft cache would hold them at inference), the K/V of
their own block, and nothing else. All blocks of a sequence run in one attention
call with one boolean mask, reusing the `DFlashDraft` submodules unchanged, so a
single-anchor forward equals `draft.append_context` + `draft(...)` (tested).
"""

import math
from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..draft import DFlashDraft


def sample_anchors(
    prompt_len: int, seq_len: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """Up to `n` distinct sorted anchor positions among the response tokens.

    An anchor needs at least one token after it, so anchors lie in
    [prompt_len, seq_len - 2].
    """
    lo, hi = prompt_len, seq_len - 1
    if hi <= lo:
        return np.zeros((0,), dtype=np.int64)
    count = min(n, hi - lo)
    return np.sort(rng.choice(np.arange(lo, hi), size=count, replace=False))


def block_attention_mask(
    anchors: mx.array,
    ctx_len: int,
    block_size: int,
    *,
    causal: bool = False,
    window: Optional[int] = None,
) -> mx.array:
    """Boolean visibility (N, 1, A*B, ctx_len + A*B) of [context ; all blocks] keys.

    Row (a, j) is query j of the block anchored at anchors[:, a]. It sees context
    key s iff s < anchor, and block key (a', j') iff a' == a. `causal`/`window`
    add the same restrictions as the inference mask (`draft.block_mask`).
    """
    N, A = anchors.shape
    B = block_size
    idx = mx.arange(A * B)
    qa, qj = idx // B, idx % B
    q_anchor = anchors[:, qa]  # (N, AB)
    qpos = q_anchor + qj
    s = mx.arange(ctx_len)
    ctx_vis = s[None, None, :] < q_anchor[:, :, None]  # (N, AB, S)
    blk_vis = mx.broadcast_to((qa[:, None] == qa[None, :])[None], (N, A * B, A * B))
    if causal or window is not None:
        kpos_ctx = mx.broadcast_to(s[None, None, :], ctx_vis.shape)
        kpos_blk = mx.broadcast_to(qpos[:, None, :], blk_vis.shape)
        q = qpos[:, :, None]
        for name, kpos in (("ctx", kpos_ctx), ("blk", kpos_blk)):
            vis = mx.ones(kpos.shape, dtype=mx.bool_)
            if causal:
                vis = vis & (kpos <= q)
            if window is not None:
                vis = vis & (q - kpos < window)
                if not causal:
                    vis = vis & (kpos - q < window)
            if name == "ctx":
                ctx_vis = ctx_vis & vis
            else:
                blk_vis = blk_vis & vis
    return mx.concatenate([ctx_vis, blk_vis], axis=-1)[:, None]


def _attention(attn, x, ctx, anchors, mask):
    """One DraftAttention over all blocks; x: (N, A*B, H), ctx: (N, S, H)."""
    N, AB, H = x.shape
    A = anchors.shape[1]
    B = AB // A
    offsets = anchors.reshape(-1)
    xb = x.reshape(N * A, B, H)
    q = attn.q_norm(attn.q_proj(xb).reshape(N * A, B, attn.n_heads, -1))
    q = attn.rope(q.transpose(0, 2, 1, 3), offset=offsets)  # (NA, h, B, d)
    kb, vb = attn.kv(xb, offsets)  # (NA, kvh, B, d)
    kc, vc = attn.kv(ctx, 0)  # (N, kvh, S, d)

    def blocks(t):  # (NA, h, B, d) -> (N, h, A*B, d)
        h, d = t.shape[1], t.shape[3]
        return t.reshape(N, A, h, B, d).transpose(0, 2, 1, 3, 4).reshape(N, h, AB, d)

    q, kb, vb = blocks(q), blocks(kb), blocks(vb)
    k = mx.concatenate([kc.astype(kb.dtype), kb], axis=2)
    v = mx.concatenate([vc.astype(vb.dtype), vb], axis=2)
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=attn.scale, mask=mask)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(N, AB, -1))


def draft_blocks_forward(
    draft: DFlashDraft,
    block_embeds: mx.array,
    features: mx.array,
    anchors: mx.array,
) -> mx.array:
    """Normed draft hidden states of every block: (N, A, B, H).

    Args:
        draft: the draft model (its submodules are used as they are).
        block_embeds: (N, A, B, H) target embeddings of `[token p, MASK...]`.
        features: (N, S, k*H) target features of the sequences (context).
        anchors: (N, A) anchor positions (block a covers anchors[:, a] + 0..B-1).
    """
    N, A, B, H = block_embeds.shape
    ctx = draft.project(features)
    h = block_embeds.reshape(N, A * B, H).astype(draft.dtype)
    masks = {}
    for layer in draft.layers:
        attn = layer.self_attn
        key = (attn.causal, attn.window)
        if key not in masks:
            masks[key] = block_attention_mask(
                anchors, ctx.shape[1], B, causal=attn.causal, window=attn.window
            )
        r = _attention(attn, layer.input_layernorm(h), ctx, anchors, masks[key])
        h = h + r
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.norm(h).reshape(N, A, B, H)


def position_weights(block_size: int, gamma: float) -> mx.array:
    """exp(-(k-1)/gamma) for block positions k = 1 .. B-1 (position 0 is the anchor)."""
    k = mx.arange(1, block_size, dtype=mx.float32)
    return mx.exp(-(k - 1) / gamma)


def default_gamma(block_size: int) -> float:
    # The paper's values: 7 for B=16, 5 for B=10, 4 for B=8.
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size * 7 / 16))


def make_blocks(
    tokens: mx.array, anchors: mx.array, block_size: int, mask_token_id: int
):
    """Block ids (N, A, B), labels (N, A, B-1) and label positions."""
    N, S = tokens.shape
    j = mx.arange(block_size)
    pos = anchors[:, :, None] + j  # (N, A, B)
    labels = mx.take_along_axis(
        tokens, mx.minimum(pos[:, :, 1:], S - 1).reshape(N, -1), axis=1
    ).reshape(N, anchors.shape[1], block_size - 1)
    first = mx.take_along_axis(tokens, anchors, axis=1)[:, :, None]
    mask = mx.full((N, anchors.shape[1], block_size - 1), mask_token_id, tokens.dtype)
    ids = mx.concatenate([first, mask], axis=-1)
    return ids, labels, pos[:, :, 1:]


def block_loss(
    draft: DFlashDraft,
    target,
    tokens: mx.array,
    lengths: mx.array,
    features: mx.array,
    anchors: mx.array,
    anchor_valid: mx.array,
    *,
    gamma: float,
):
    """Position-weighted cross-entropy of all blocks, plus accuracy statistics.

    Args:
        tokens: (N, S) padded sequences (prompt + response).
        lengths: (N,) true lengths; labels at or past a length do not count.
        features: (N, S, k*H) target features (no gradient flows into the target).
        anchors, anchor_valid: (N, A) positions and which of them are real.

    Returns `(loss, stats)`: stats holds per-position correct counts, the count
    of valid labels, and the summed accepted length (for a tau estimate).
    """
    B = draft.args.block_size
    ids, labels, pos = make_blocks(tokens, anchors, B, draft.args.mask_token_id)
    embeds = mx.stop_gradient(target.embed(ids))
    h = draft_blocks_forward(draft, embeds, mx.stop_gradient(features), anchors)
    logits = target.head(h[:, :, 1:]).astype(mx.float32)  # (N, A, B-1, V)
    valid = (pos < lengths[:, None, None]) & anchor_valid[:, :, None]
    w = position_weights(B, gamma) * valid
    ce = nn.losses.cross_entropy(logits, labels, reduction="none")
    loss = (ce * w).sum() / mx.maximum(w.sum(), 1e-6)
    correct = (mx.argmax(logits, axis=-1) == labels) & valid
    # Accepted length of a block: leading run of correct predictions, + 1 bonus.
    run = mx.cumprod(correct.astype(mx.int32), axis=-1).sum(-1)
    stats = {
        "correct": mx.stop_gradient(correct.sum(axis=(0, 1))),
        "valid": mx.stop_gradient(valid.sum(axis=(0, 1))),
        "accepted": mx.stop_gradient((run * anchor_valid).sum()),
        "blocks": anchor_valid.sum(),
    }
    return loss, stats


def target_features(target, tokens: mx.array) -> mx.array:
    """Captured target layer outputs for whole (N, S) sequences, causal, no cache."""
    _, features = target.forward(tokens, None, last_only=True)
    return mx.stop_gradient(features)
