"""The DFlash training objective: random anchors, one block attention mask, weighted CE.

Every anchor p (a response position) makes a block `[token p, MASK x (B-1)]` at
positions p .. p+B-1. Its queries see the context K/V of positions < p (from the
target's features, as the draft cache would hold them at inference), the K/V of
their own block, and nothing else. All blocks of a sequence run in one batched
attention over [context ; own block] keys with one boolean mask, reusing the
`DFlashDraft` submodules unchanged, so a single-anchor forward equals
`draft.append_context` + `draft(...)` (tested).
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..draft import DFlashDraft, restrict


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
    """Boolean visibility (N, A*B, ctx_len + B) of [context ; own block] keys.

    Row (a, j) is query j of the block anchored at anchors[:, a]. It sees context
    key s iff s < anchor, and key j' of its own block; other blocks are not keys
    at all (`_attention` never scores them). `causal`/`window` add the same
    restrictions as the inference mask (`draft.block_mask`).
    """
    N, A = anchors.shape
    B = block_size
    q_anchor = mx.repeat(anchors, B, axis=1)  # (N, AB)
    qpos = q_anchor + mx.tile(mx.arange(B), A)
    kpos = mx.concatenate(
        [
            mx.broadcast_to(mx.arange(ctx_len), (N, A * B, ctx_len)),
            q_anchor[:, :, None] + mx.arange(B),
        ],
        axis=-1,
    )
    vis = mx.concatenate(
        [
            mx.arange(ctx_len) < q_anchor[:, :, None],
            mx.ones((N, A * B, B), dtype=mx.bool_),
        ],
        axis=-1,
    )
    return restrict(vis, qpos[:, :, None], kpos, causal=causal, window=window)


def _attention(attn, x, ctx, anchors, mask):
    """One DraftAttention over all blocks; x: (N, A*B, H), ctx: (N, S, H).

    Each query scores the S context keys and the B keys of its own block only,
    not all A*B block keys that one dense masked call would score.
    """
    N, AB, H = x.shape
    A = anchors.shape[1]
    B, S = AB // A, ctx.shape[1]
    kvh = attn.n_kv_heads
    rep = attn.n_heads // kvh
    xb = x.reshape(N * A, B, H)
    offsets = anchors.reshape(-1)
    q = attn.q_norm(attn.q_proj(xb).reshape(N * A, B, attn.n_heads, -1))
    q = attn.rope(q.transpose(0, 2, 1, 3), offset=offsets)  # (NA, h, B, d)
    kb, vb = attn.kv(xb, offsets)  # (NA, kvh, B, d)
    kc, vc = attn.kv(ctx, 0)  # (N, kvh, S, d)
    d = q.shape[-1]
    # Query head i reads kv head i // rep (as sdpa's GQA): group them.
    q = q.reshape(N, A, kvh, rep, B, d).transpose(0, 2, 3, 1, 4, 5) * attn.scale
    kb = kb.reshape(N, A, kvh, 1, B, d).transpose(0, 2, 3, 1, 4, 5)
    vb = vb.reshape(N, A, kvh, 1, B, d).transpose(0, 2, 3, 1, 4, 5)
    s_ctx = q.reshape(N, kvh, rep, AB, d) @ kc[:, :, None].swapaxes(-1, -2)
    s_blk = (q @ kb.swapaxes(-1, -2)).reshape(N, kvh, rep, AB, B)
    scores = mx.concatenate([s_ctx, s_blk.astype(s_ctx.dtype)], axis=-1)
    scores = mx.where(mask[:, None, None], scores, -mx.inf)
    p = mx.softmax(scores, axis=-1, precise=True)
    out = p[..., :S] @ vc[:, :, None].astype(p.dtype)
    blk = p[..., S:].reshape(N, kvh, rep, A, B, B) @ vb.astype(p.dtype)
    out = out + blk.reshape(N, kvh, rep, AB, d)
    out = out.reshape(N, kvh * rep, AB, d).transpose(0, 2, 1, 3).astype(x.dtype)
    return attn.o_proj(out.reshape(N, AB, -1))


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
    rows: Optional[mx.array] = None,
    head=None,
    soft: Optional[tuple] = None,
    soft_weight: float = 0.0,
):
    """Position-weighted cross-entropy of all blocks, plus accuracy statistics.

    Args:
        tokens: (N, S) padded sequences (prompt + response).
        lengths: (N,) true lengths; labels at or past a length do not count.
        features: (N, S, k*H) target features (no gradient flows into the target).
        anchors, anchor_valid: (N, A) positions and which of them are real.
        rows: flat indices into the (N, A, B-1) labels of those that count
          (`label_rows`), -1 for padding. Only these rows go through the head,
          the step's largest matmul; None scores every row.
        head: the frozen output head (default `target.head`; see `dense_head`).
        soft: the target's own next-token distributions (`soft_labels`:
          top-k ids and probabilities (N, S, k) at every position); with
          `soft_weight` w the loss per label is (1 - w) * CE(label) +
          w * sum_k -p_k log q(id_k), q the draft's distribution.

    Returns `(loss, stats)`: stats holds per-position correct counts, the count
    of valid labels, and the summed accepted length (for a tau estimate).
    """
    B = draft.args.block_size
    head = head or target.head
    ids, labels, pos = make_blocks(tokens, anchors, B, draft.args.mask_token_id)
    embeds = mx.stop_gradient(target.embed(ids))
    h = draft_blocks_forward(draft, embeds, mx.stop_gradient(features), anchors)
    valid = (pos < lengths[:, None, None]) & anchor_valid[:, :, None]
    w = position_weights(B, gamma) * valid  # (N, A, B-1)
    h, labels, w = (
        h[:, :, 1:].reshape(-1, h.shape[-1]),
        labels.reshape(-1),
        w.reshape(-1),
    )
    if rows is not None:
        sel = mx.maximum(rows, 0)
        h, labels, w = h[sel], labels[sel], w[sel] * (rows >= 0)
    logits = head(h).astype(mx.float32)  # (rows, V)
    ce = nn.losses.cross_entropy(logits, labels, reduction="none")
    if soft is not None and soft_weight > 0:
        # The target's distribution for the label at position t is its output
        # at t - 1 (flat index into the (N * S) positions of `soft`).
        S = tokens.shape[1]
        at = (mx.arange(pos.shape[0])[:, None, None] * S + mx.minimum(pos, S) - 1).reshape(-1)
        if rows is not None:
            at = at[sel]
        ids, probs = (x.reshape(-1, x.shape[-1])[at] for x in soft)
        logq = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        soft_ce = -(probs * mx.take_along_axis(logq, ids, axis=-1)).sum(-1)
        ce = (1 - soft_weight) * ce + soft_weight * soft_ce
    loss = (ce * w).sum() / mx.maximum(w.sum(), 1e-6)
    correct = (mx.argmax(logits, axis=-1) == labels) & (w > 0)
    if rows is not None:
        correct = mx.zeros(valid.size, mx.int32).at[sel].add(correct) > 0
    correct = correct.reshape(valid.shape)
    # Accepted length of a block: leading run of correct predictions, + 1 bonus.
    run = mx.cumprod(correct.astype(mx.int32), axis=-1).sum(-1)
    stats = {
        "correct": mx.stop_gradient(correct.sum(axis=(0, 1))),
        "valid": mx.stop_gradient(valid.sum(axis=(0, 1))),
        "accepted": mx.stop_gradient((run * anchor_valid).sum()),
        "blocks": anchor_valid.sum(),
        "run": mx.stop_gradient(run * anchor_valid),  # (N, A): each block's correct run
    }
    return loss, stats


def label_rows(
    anchors: np.ndarray, counts: np.ndarray, lengths: np.ndarray, block_size: int
) -> np.ndarray:
    """Flat indices of the labels that count in `block_loss`, padded with -1 to
    a multiple of 256 (few distinct shapes).

    Args:
        anchors: (N, A) positions; row n uses its first counts[n].
        lengths: (N,) sequence lengths (a label at or past it does not count).
    """
    N, A = anchors.shape
    k = np.arange(1, block_size)
    ok = (np.arange(A)[None, :, None] < counts[:, None, None]) & (
        anchors[:, :, None] + k < lengths[:, None, None]
    )
    rows = np.flatnonzero(ok.reshape(-1)).astype(np.int32)
    size = max(256, -(-len(rows) // 256) * 256)
    return np.concatenate([rows, np.full(size - len(rows), -1, np.int32)])


def dense_head(target, dtype: mx.Dtype):
    """The target's frozen output head as one dense matrix in `dtype`.

    A quantized head (the GGUF target's 8-bit tied embedding) is dequantized
    once, so each training step runs a plain matmul over its many block rows
    instead of a quantized one; the weights are the same, and never trained.
    """
    module = getattr(target.head, "__self__", target.head)  # tied: embed.as_linear
    w = module.weight
    if hasattr(module, "scales"):
        extra = {"mode": module.mode} if hasattr(module, "mode") else {}
        w = mx.dequantize(
            w,
            module.scales,
            module.get("biases"),
            group_size=module.group_size,
            bits=module.bits,
            **extra,
        )
    w = w.astype(dtype)
    bias = module.get("bias") if hasattr(module, "get") else None
    mx.eval(w)

    def head(x):
        y = x.astype(dtype) @ w.T
        return y if bias is None else y + bias.astype(dtype)

    return head


def target_features(target, tokens: mx.array) -> mx.array:
    """Captured target layer outputs for whole (N, S) sequences, causal, no cache."""
    _, features = target.forward(tokens, None, last_only=True)
    return mx.stop_gradient(features)


def soft_labels(target, tokens: mx.array, top_k: int):
    """Captured features as `target_features`, and the target's next-token
    distribution at every position as its `top_k` most likely ids (N, S, k)
    and their probabilities (the rest of the mass is left out): `block_loss`'s
    `soft`. One forward for both."""
    logits, features = target.forward(tokens, None)
    logits = logits.astype(mx.float32)
    k = min(top_k, logits.shape[-1])
    ids = mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k]
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    probs = mx.exp(mx.take_along_axis(logp, ids, axis=-1))
    return mx.stop_gradient(features), (ids, mx.stop_gradient(probs))
