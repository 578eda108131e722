"""Speculative decoding: prefill -> draft -> verify -> accept -> commit/rollback.

Only this module knows the cycle. Each cycle the drafter proposes up to B-1
tokens after the anchor (the last emitted token, not yet in any cache), the
target verifies `[anchor, d1 .. d(B-1)]` in one pass, the longest prefix that
matches the target's own choices is accepted, and the target's token at the
first mismatch is emitted as the bonus. Caches are then rolled back so that
they hold exactly the emitted tokens minus the last one, as plain
autoregressive decoding would. One host sync per cycle.
"""

import os
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Iterable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .drafters import Drafter
from .rollback import rollback, snapshot
from .sampling import SamplingParams, probs, speculative_accept
from .target import Target


@dataclass
class SpecStats:
    """Speculative statistics of one generation.

    `tau` is the mean accepted length per cycle, bonus token included
    (1 .. block size). `acceptance_rate` is per drafted token: accepted draft
    tokens / drafted tokens. `draft_share` is the share of emitted tokens that
    came from the draft; it is *not* an acceptance rate.
    """

    block_size: int
    cycles: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_at: List[int] = field(default_factory=list)
    drafted_at: List[int] = field(default_factory=list)
    # Acceptance-collapse fallback: tokens and seconds decoded plainly / speculatively.
    plain_tokens: int = 0
    plain_seconds: float = 0.0
    spec_seconds: float = 0.0
    fallbacks: int = 0

    def __post_init__(self):
        self.accepted_at = [0] * max(self.block_size - 1, 0)
        self.drafted_at = [0] * max(self.block_size - 1, 0)

    def record(self, drafted: int, accepted: int, emitted: int):
        self.cycles += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1

    @property
    def tau(self) -> float:
        return (self.accepted + self.cycles) / self.cycles if self.cycles else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def draft_share(self) -> float:
        total = self.emitted + self.plain_tokens
        return self.accepted / total if total else 0.0

    @property
    def per_position(self) -> List[float]:
        """P(draft position i accepted | it was drafted), i = 1 .. B-1."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_dict(self) -> dict:
        return {
            "block_size": self.block_size,
            "cycles": self.cycles,
            "tau": round(self.tau, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "draft_share": round(self.draft_share, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_position_acceptance": [round(p, 4) for p in self.per_position],
            "fallback": {
                "switches_to_plain": self.fallbacks,
                "plain_tokens": self.plain_tokens,
                "plain_seconds": round(self.plain_seconds, 4),
                "speculative_seconds": round(self.spec_seconds, 4),
            },
        }


@dataclass
class Fallback:
    """Decode plainly while speculation costs more time per token than it saves.

    Speculation pays when tokens per cycle (tau) exceed the cycle's cost in
    plain decoding steps. After `window` speculative cycles below break-even,
    decode `plain_tokens` tokens plainly, then probe speculation again for
    `window` cycles; each failed probe doubles the plain stretch (up to
    `max_plain`), so a collapsed drafter costs only the short probes, never a
    full block every cycle.

    Args:
        window: speculative cycles per decision.
        plain_tokens: first plain stretch.
        max_plain: longest plain stretch.
        break_even: fixed tau threshold; None = measured from the run's own
          timings (seconds per token speculatively vs plainly).
    """

    window: int = 4
    plain_tokens: int = 16
    max_plain: int = 256
    break_even: Optional[float] = None


class _FallbackState:
    def __init__(self, cfg: Fallback):
        self.cfg = cfg
        self.stretch = cfg.plain_tokens
        self.plain_left = 0
        self.recent: List[Tuple[int, float]] = []  # (tokens, seconds) per spec cycle
        self.plain_cost: Optional[float] = None  # seconds per plain token (EMA)

    @property
    def plain(self) -> bool:
        return self.plain_left > 0

    def after_plain(self, seconds: float):
        self.plain_left -= 1
        c = self.plain_cost
        self.plain_cost = seconds if c is None else 0.8 * c + 0.2 * seconds

    def after_spec(self, tokens: int, seconds: float, stats: SpecStats):
        self.recent.append((tokens, seconds))
        if len(self.recent) < self.cfg.window:
            return
        n = sum(t for t, _ in self.recent)
        secs = sum(t for _, t in self.recent)
        tau = n / len(self.recent)
        self.recent = []
        if self.cfg.break_even is not None:
            losing = tau < self.cfg.break_even
        elif self.plain_cost is None:
            losing = True  # measure plain decoding once, then compare
        else:
            losing = secs / n > self.plain_cost
        if losing:
            self.plain_left = self.stretch
            self.stretch = min(2 * self.stretch, self.cfg.max_plain)
            stats.fallbacks += 1
        else:
            self.stretch = self.cfg.plain_tokens


def prefill(
    target: Target,
    cache: List[Any],
    drafter: Drafter,
    prompt: Sequence[int],
    *,
    step_size: int = 2048,
    cached: int = 0,
) -> mx.array:
    """Fill the caches with `prompt`; return the logits of its last row only.

    With `cached` > 0 the target cache and the drafter already hold
    `prompt[:cached]` (a reused prompt cache) and only the rest is run.
    """
    if not 0 <= cached < len(prompt):
        raise ValueError(f"cached prefix {cached} must be shorter than the prompt")
    if cached == 0:
        drafter.start(prompt)
    logits = None
    for s in range(cached, len(prompt), step_size):
        chunk = list(prompt[s : s + step_size])
        last = s + step_size >= len(prompt)
        logits, features = target.forward(mx.array([chunk]), cache, last_only=True)
        drafter.commit(chunk, features)
        mx.eval([c.state for c in cache] + ([] if last else [features]))
        if not last:
            mx.clear_cache()
    return logits[:, -1]


def generate_step(
    target: Target,
    prompt: Sequence[int],
    drafter: Drafter,
    *,
    cache: Optional[List[Any]] = None,
    max_tokens: int = 256,
    block_size: int = 16,
    stop_tokens: Iterable[int] = (),
    prefill_step_size: int = 2048,
    cached: int = 0,
    sampling: Optional[SamplingParams] = None,
    logprobs: Optional[int] = None,
    fallback: Optional[Fallback] = None,
    stats: Optional[SpecStats] = None,
) -> Generator[tuple, None, None]:
    """Speculative decoding whose output is the target's own.

    Greedy (the default) is token for token equal to plain greedy decoding;
    with a temperature, speculative sampling keeps the output distributed
    exactly as sampling from the target alone.

    Args:
        target: the target model adapter.
        prompt: prompt token ids.
        drafter: a `Drafter`; block_size 1 decodes plainly.
        cache: target cache to fill (default: a fresh one).
        max_tokens: exact number of tokens to generate at most.
        block_size: verify block size B (anchor + B-1 drafted tokens).
        stop_tokens: generation ends at the first of these (it is yielded).
        prefill_step_size: prompt chunk size.
        cached: `cache` and `drafter` already hold `prompt[:cached]` (prompt
          cache reuse); only the rest is prefilled.
        sampling: temperature / top-p / top-k / min-p / seed (default greedy).
        logprobs: None, or the number of top log-probabilities to return with
          each token (0 = only the token's own).
        fallback: decode plainly while speculation does not pay (None = never).
        stats: filled in as cycles complete.

    When the generator is exhausted, `cache` and the drafter hold
    `prompt + output[:-1]`, exactly as plain decoding would leave them.

    Yields:
        (token, from_draft) pairs; with `logprobs` set,
        (token, from_draft, (logprob, [(id, logprob), ...])).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not prompt:
        raise ValueError("the prompt is empty")
    params = sampling or SamplingParams()
    stop = set(int(t) for t in stop_tokens)
    cache = target.make_cache() if cache is None else cache
    stats = SpecStats(block_size) if stats is None else stats
    seed = (
        params.seed
        if params.seed is not None
        else int.from_bytes(os.urandom(4), "little")
    )
    key = mx.random.key(seed)

    logits = prefill(
        target, cache, drafter, prompt, step_size=prefill_step_size, cached=cached
    )
    key, k = mx.random.split(key)
    if params.greedy:
        first = mx.argmax(logits, axis=-1)
    else:
        first = mx.random.categorical(mx.log(probs(logits, params)), key=k)
    lp = _logprobs(logits, first, logprobs)
    mx.eval(first, lp)
    y = int(first.item())
    yield _out(y, False, lp, 0, logprobs)
    n_out = 1
    if y in stop:
        return

    sampled_drafts = not params.greedy and hasattr(drafter, "propose_sampled")
    fb = _FallbackState(fallback) if fallback is not None and block_size > 1 else None
    tic = time.perf_counter()
    while n_out < max_tokens:
        plain = fb is not None and fb.plain
        # Never verify more than can still be emitted: exact max_tokens, less work.
        n_draft = 0 if plain else min(block_size, max_tokens - n_out) - 1
        key, k_draft, k_accept = mx.random.split(key, 3)
        q = None
        if n_draft == 0:
            draft = mx.array([], mx.uint32)
        elif sampled_drafts:
            draft, q = drafter.propose_sampled(y, n_draft, params, k_draft)
        else:
            draft = drafter.propose(y, n_draft)
        draft = draft.astype(mx.uint32)
        verify_in = mx.concatenate([mx.array([y], dtype=mx.uint32), draft])
        saved = snapshot(cache, target.delta_taps)
        logits, features = target.forward(verify_in[None], cache)
        logits = logits[0]
        if params.greedy:
            candidates = mx.argmax(logits, axis=-1)
            accepted = draft == candidates[:-1]
        else:
            p = probs(logits, params)
            accepted, candidates = speculative_accept(draft, q, p, k_accept)
        lp = _logprobs(logits, candidates, logprobs, draft)

        # --- accept: the one host sync of the cycle
        mx.eval(accepted, candidates, draft, lp)
        accepted, candidates, draft = (
            accepted.tolist(),
            candidates.tolist(),
            draft.tolist(),
        )
        a = 0
        while a < len(draft) and accepted[a]:
            a += 1
        emitted = draft[:a] + [candidates[a]]
        for i, t in enumerate(emitted):
            if t in stop:
                emitted = emitted[: i + 1]
                break
        emitted = emitted[: max_tokens - n_out]
        m = len(emitted)

        # --- commit / rollback: caches keep anchor + emitted[:-1]
        kept = m
        rollback(cache, target.delta_taps, saved, verified=len(draft) + 1, kept=kept)
        drafter.commit(
            [y] + emitted[:-1], None if features is None else features[:, :kept]
        )
        now = time.perf_counter()
        if plain:
            fb.after_plain(now - tic)
            stats.plain_tokens += m
            stats.plain_seconds += now - tic
        else:
            stats.record(drafted=len(draft), accepted=min(a, m), emitted=m)
            stats.spec_seconds += now - tic
            if fb is not None:
                fb.after_spec(m, now - tic, stats)

        for i, t in enumerate(emitted):
            yield _out(t, i < a, lp, i, logprobs, from_draft_row=i < a)
        n_out += m
        y = emitted[-1]
        if y in stop:
            return
        tic = time.perf_counter()


def _logprobs(logits, candidates, top: Optional[int], draft=None):
    """Target log-probabilities (before sampling transforms) of each row's
    candidate and drafted token, plus the row's top entries; None if not asked."""
    if top is None:
        return None
    logits = logits.reshape(-1, logits.shape[-1]).astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    cand = mx.take_along_axis(lp, candidates.reshape(-1, 1).astype(mx.int32), -1)[:, 0]
    out = {"candidate": cand}
    if draft is not None and draft.size:
        idx = draft.reshape(-1, 1).astype(mx.int32)
        out["draft"] = mx.take_along_axis(lp[: draft.size], idx, -1)[:, 0]
    if top > 0:
        k = min(top, lp.shape[-1])
        ids = mx.argpartition(-lp, kth=k - 1, axis=-1)[:, :k]
        out["top_ids"] = ids
        out["top_lp"] = mx.take_along_axis(lp, ids, -1)
    return out


def _out(token, from_draft, lp, row, top, from_draft_row=False):
    if top is None:
        return token, from_draft
    value = (lp["draft"] if from_draft_row else lp["candidate"])[row].item()
    tops = []
    if top > 0:
        pairs = zip(lp["top_ids"][row].tolist(), lp["top_lp"][row].tolist())
        tops = sorted(pairs, key=lambda x: -x[1])
    return token, from_draft, (value, tops)


@dataclass
class GenerationResponse:
    """One streamed piece of output, shaped like mlx_lm's, plus speculative stats."""

    text: str
    token: int
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: Optional[str] = None
    stats: Optional[SpecStats] = None
    logprob: Optional[float] = None
    top_logprobs: Optional[List[Tuple[int, float]]] = None


def stream_generate(
    target: Target,
    tokenizer,
    prompt,
    drafter: Drafter,
    *,
    max_tokens: int = 256,
    block_size: int = 16,
    stop_tokens: Optional[Iterable[int]] = None,
    prefill_step_size: int = 2048,
    cache: Optional[List[Any]] = None,
    cached: int = 0,
    sampling: Optional[SamplingParams] = None,
    logprobs: Optional[int] = None,
    fallback: Optional[Fallback] = None,
) -> Generator[GenerationResponse, None, None]:
    """Stream text like `mlx_lm.stream_generate`, decoding speculatively.

    Args:
        target, drafter: see `generate_step`.
        tokenizer: an mlx_lm `TokenizerWrapper`.
        prompt: a string (encoded as-is) or token ids.
        max_tokens, block_size, prefill_step_size, cache, cached, sampling,
          logprobs, fallback: see `generate_step`.
        stop_tokens: default: the tokenizer's EOS ids.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
    prompt = list(prompt)
    stop = set(tokenizer.eos_token_ids if stop_tokens is None else stop_tokens)
    stats = SpecStats(block_size)
    detok = tokenizer.detokenizer
    detok.reset()

    tic = time.perf_counter()
    prompt_tps = 0.0
    n = 0
    token, from_draft, lp = None, False, (None, None)

    def response(finish_reason):
        return GenerationResponse(
            text=detok.last_segment,
            token=token,
            from_draft=from_draft,
            prompt_tokens=len(prompt),
            prompt_tps=prompt_tps,
            generation_tokens=n + 1,
            generation_tps=(n + 1) / max(time.perf_counter() - tic, 1e-9),
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish_reason,
            stats=stats,
            logprob=lp[0],
            top_logprobs=lp[1],
        )

    for n, step in enumerate(
        generate_step(
            target,
            prompt,
            drafter,
            max_tokens=max_tokens,
            block_size=block_size,
            stop_tokens=stop,
            prefill_step_size=prefill_step_size,
            cache=cache,
            cached=cached,
            sampling=sampling,
            logprobs=logprobs,
            fallback=fallback,
            stats=stats,
        )
    ):
        token, from_draft = step[:2]
        lp = step[2] if logprobs is not None else (None, None)
        if n == 0:
            prompt_time = time.perf_counter() - tic
            prompt_tps = (len(prompt) - cached) / prompt_time
            tic = time.perf_counter()
        if token in stop:
            break
        detok.add_token(token)
        if n + 1 == max_tokens:
            break
        yield response(None)
    detok.finalize()
    yield response("stop" if token in stop else "length")
