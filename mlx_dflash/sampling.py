"""Greedy and lossless speculative sampling.

Speculative sampling (Leviathan et al. / Chen et al.): draft token x drafted
from q is accepted with probability min(1, p(x)/q(x)); at the first rejection
the emitted token is drawn from the normalised residual max(0, p - q); if all
drafts pass, the bonus is drawn from p. The emitted sequence is then
distributed exactly as sampling from the target alone. Deterministic drafters
(prompt lookup, oracle) are one-hot: q(x) = 1.

p and q go through the same transforms, taken from mlx_lm's own sampler
(top-p, min-p, top-k on log-probabilities, then temperature), so "target-only
sampling" means exactly `mlx_lm.sample_utils.make_sampler` with these settings.
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


def probs(logits: mx.array, params: SamplingParams) -> mx.array:
    """The sampling distribution (float32) over the last axis after all transforms."""
    x = logits.astype(mx.float32)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)
    # Same order as mlx_lm.make_sampler: top-p, min-p, top-k, then temperature.
    if 0 < params.top_p < 1.0:
        x = apply_top_p(x, params.top_p)
    if params.min_p > 0:
        x = apply_min_p(x, params.min_p)
    if 0 < params.top_k < x.shape[-1]:
        x = apply_top_k(x, params.top_k)
    return mx.softmax(x / params.temperature, axis=-1)


def pick(logits: mx.array, params: SamplingParams, key=None) -> mx.array:
    """The target's own choice from `logits`: argmax when greedy, else a draw
    from `probs` with `key` (as plain decoding would make it)."""
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return mx.random.categorical(mx.log(probs(logits, params)), key=key)


def sample_draft(
    logits: mx.array, params: SamplingParams, key
) -> Tuple[mx.array, mx.array]:
    """Draw draft tokens from the drafter's own distribution q; return (tokens, q)."""
    q = probs(logits, params)
    tokens = mx.random.categorical(mx.log(q), key=key)
    return tokens, q


def speculative_accept(
    draft: mx.array,
    q: Optional[mx.array],
    p: mx.array,
    key,
) -> Tuple[mx.array, mx.array]:
    """Accept/reject a draft against the target distribution, all on device.

    Args:
        draft: (m,) drafted tokens.
        q: (m, V) the draft distributions, or None for a one-hot drafter.
        p: (m+1, V) the target distributions at the m draft positions + bonus.
        key: a PRNG key.

    Returns:
        `(accepted, candidates)`: accepted[i] says whether draft i passed its
        test (the caller takes the leading run), and candidates[i] is the token
        to emit if the first rejection is at i (candidates[m] is the bonus).
    """
    m = draft.shape[0]
    k_u, k_s = mx.random.split(key)
    if q is None:
        q = mx.zeros_like(p[:m])
        if m:
            q = mx.put_along_axis(
                q, draft[:, None].astype(mx.int32), mx.array(1.0), axis=-1
            )
    idx = draft[:, None].astype(mx.int32)
    p_x = mx.take_along_axis(p[:m], idx, axis=-1)[:, 0]
    q_x = mx.take_along_axis(q, idx, axis=-1)[:, 0]
    u = mx.random.uniform(shape=(m,), key=k_u)
    # u < p/q without dividing by a zero q (q(x) > 0 whenever x was drafted from q).
    accepted = u * q_x < p_x
    residual = mx.maximum(p[:m] - q, 0.0)
    # A zero residual only happens when p == q, where no rejection can occur.
    residual = mx.where(residual.sum(-1, keepdims=True) > 0, residual, p[:m])
    rows = mx.concatenate([residual, p[m:]], axis=0)
    candidates = mx.random.categorical(mx.log(rows), key=k_s)
    return accepted, candidates
