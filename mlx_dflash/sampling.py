"""Greedy and lossless speculative sampling.

Speculative sampling (Leviathan et al. / Chen et al.): draft token x drafted
from q is accepted with probability min(1, p(x)/q(x)); at the first rejection
the emitted token is drawn from the normalised residual max(0, p - q); if all
drafts pass, the bonus is drawn from p. The emitted sequence is then
distributed exactly as sampling from the target alone.

Deterministic drafters (prompt lookup, oracle, engine) are one-hot, q(x) = 1:
then accepting with probability p(x) and drawing the rejected row from p
without x is the same as drawing every row from p and accepting while the draw
equals the draft. That is the greedy rule with each row's argmax replaced by a
draw, one Gumbel-max pass over the block and nothing else. With a drafter's
own q, only the rows' normalisers and the drafted entries are computed for the
whole block; the residual is formed and drawn from for the one rejected row.

p and q go through the same transforms, taken from mlx_lm's own sampler
(top-p, min-p, top-k on log-probabilities, then temperature), so "target-only
sampling" means exactly `mlx_lm.sample_utils.make_sampler` with these settings.
A temperature alone needs no normalisation first: the draws take unnormalised
log-weights (logits / T), which `mx.random.categorical` normalises implicitly.
The accepted length stays on the device, an array rather than a shape, so
every cycle builds the same graph; `warm` runs what backends build on first
use (CUDA's JIT-compiled gathers, the `mx.compile`d transforms) ahead of the
first request.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @classmethod
    def from_options(cls, options, *, temperature=None) -> "SamplingParams":
        """From anything with `top_p`, `top_k`, `min_p` and `seed` attributes
        (parsed flags, a server job), and its `temperature` unless given."""
        return cls(
            temperature=options.temperature if temperature is None else temperature,
            top_p=options.top_p,
            top_k=options.top_k,
            min_p=options.min_p,
            seed=options.seed,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filtered(self) -> bool:
        """Whether top-p, min-p or top-k remove tokens (else: temperature only)."""
        return 0 < self.top_p < 1.0 or self.min_p > 0 or self.top_k > 0


def log_weights(logits: mx.array, params: SamplingParams) -> mx.array:
    """The sampling distribution as float32 log-weights over the last axis:
    log-probabilities up to a per-row constant, -inf where a transform removed
    a token. `softmax` of it is `probs`."""
    x = logits.astype(mx.float32)
    if params.filtered:
        x = x - mx.logsumexp(x, axis=-1, keepdims=True)
        # Same order as mlx_lm.make_sampler: top-p, min-p, top-k, then temperature.
        if 0 < params.top_p < 1.0:
            x = apply_top_p(x, params.top_p)
        if params.min_p > 0:
            x = apply_min_p(x, params.min_p)
        if 0 < params.top_k < x.shape[-1]:
            x = apply_top_k(x, params.top_k)
    if params.temperature != 1.0:
        x = x * (1.0 / params.temperature)  # as mlx_lm's categorical_sampling
    return x


def probs(logits: mx.array, params: SamplingParams) -> mx.array:
    """The sampling distribution (float32) over the last axis after all transforms."""
    return mx.softmax(log_weights(logits, params), axis=-1)


def pick(logits: mx.array, params: SamplingParams, key=None) -> mx.array:
    """The target's own choice from `logits`: argmax when greedy, else a draw
    from `probs` with `key` (as plain decoding would make it)."""
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(log_weights(logits, params), key=key)


def sample_draft(
    logits: mx.array, params: SamplingParams, key
) -> Tuple[mx.array, mx.array]:
    """Draw draft tokens from the drafter's own distribution q; return
    (tokens, q as `log_weights`)."""
    q = log_weights(logits, params)
    return mx.random.categorical(q, key=key), q


def speculative_accept(
    draft: mx.array,
    q: Optional[mx.array],
    w: mx.array,
    key,
) -> Tuple[mx.array, mx.array]:
    """Accept/reject a draft against the target distribution, all on device.

    Args:
        draft: (m,) drafted tokens.
        q: (m, V) `log_weights` of the draft distributions, or None for a
          one-hot drafter.
        w: (m+1, V) `log_weights` of the target at the m draft positions + bonus.
        key: a PRNG key.

    Returns:
        `(accepted, candidates)`: accepted[i] says whether draft i passed its
        test; with `a` the length of accepted's leading run, the tokens to emit
        are candidates[:a+1] (the accepted drafts, then the residual's draw at
        the first rejection, or the bonus row's draw when all passed).
    """
    m = draft.shape[0]
    if q is None or m == 0:
        # One-hot q: each row's own draw from p, accepted while it equals the draft.
        candidates = mx.random.categorical(w, key=key)
        return draft == candidates[:m], candidates
    k_u, k_s = mx.random.split(key)
    lse_p = mx.logsumexp(w, axis=-1)
    lse_q = mx.logsumexp(q, axis=-1)
    idx = draft[:, None].astype(mx.int32)
    p_x = mx.exp(mx.take_along_axis(w[:m], idx, axis=-1)[:, 0] - lse_p[:m])
    q_x = mx.exp(mx.take_along_axis(q, idx, axis=-1)[:, 0] - lse_q)
    u = mx.random.uniform(shape=(m,), key=k_u)
    # u < p/q without dividing by a zero q (q(x) > 0 whenever x was drafted from q).
    accepted = u * q_x < p_x
    # The first rejection (m: none), and the one row drawn from: its residual
    # max(0, p - q), or p itself at the bonus row (q's row masked to zero).
    a = mx.cumprod(accepted.astype(mx.int32)).sum()
    r = mx.minimum(a, m - 1)
    p_row = mx.exp(mx.take(w, a, axis=0) - mx.take(lse_p, a))
    q_row = mx.exp(mx.take(q, r, axis=0) - mx.take(lse_q, r)) * (a < m)
    residual = mx.maximum(p_row - q_row, 0.0)
    # A zero residual only happens when p == q, where no rejection can occur.
    residual = mx.where(residual.sum() > 0, residual, p_row)
    token = mx.random.categorical(mx.log(residual), key=k_s)
    rows = mx.arange(m + 1)
    candidates = mx.where(rows == a, token, mx.concatenate([draft, draft[:1]]))
    return accepted, candidates


def warm(vocab_size: int, block_size: int, params: SamplingParams, *, drafted: bool):
    """Run the sampling steps once at every shape a generation can give them,
    so that nothing is built on first use: `mx.compile`d transforms are traced
    (and on CPU compiled to C++) per row count, CUDA's gathers are
    JIT-compiled per dtype. Temperature alone compiles nothing shape-dependent:
    one block and one row stand for all. `drafted`: q comes from the drafter."""
    if params.greedy:
        return
    rows = range(1, block_size + 1) if params.filtered else {1, block_size}
    key = mx.random.key(0)
    logits = mx.zeros((block_size, vocab_size))
    out = [pick(logits[0], params, key), pick(logits[:1], params, key)]
    for n in rows:
        draft = mx.zeros((n - 1,), mx.uint32)
        w = log_weights(logits[:n], params)
        out += speculative_accept(draft, None, w, key)
        if drafted and n > 1:
            tokens, q = sample_draft(logits[: n - 1], params, key)
            out += [tokens, *speculative_accept(draft, q, w, key)]
    mx.eval(out)
