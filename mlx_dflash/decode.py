"""Speculative decoding: prefill -> draft -> verify -> accept -> commit/rollback.

Only this module knows the cycle. Each cycle the drafter proposes up to B-1
tokens after the anchor (the last emitted token, not yet in any cache), the
target verifies `[anchor, d1 .. d(B-1)]` in one pass, the longest prefix that
matches the target's own choices is accepted, and the target's token at the
first mismatch is emitted as the bonus. Caches are then rolled back so that
they hold exactly the emitted tokens minus the last one, as plain
autoregressive decoding would. One host sync per cycle. With a `Fallback`
(fallback.py) some steps are plain: a block of the anchor alone, no draft.
"""

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .drafters import Drafter
from .fallback import Fallback, FallbackState
from .rollback import rollback, snapshot
from .sampling import SamplingParams, pick, probs, speculative_accept
from .stats import SpecStats
from .target import Target


class Cancelled(Exception):
    """Prefill stopped between chunks; the caches hold `prompt[:filled]`."""

    def __init__(self, filled: int):
        super().__init__(f"cancelled after {filled} prompt tokens")
        self.filled = filled


def prefill(
    target: Target,
    cache: List[Any],
    drafter: Drafter,
    prompt: Sequence[int],
    *,
    step_size: int = 2048,
    cached: int = 0,
    should_stop: Optional[Callable[[], bool]] = None,
) -> mx.array:
    """Fill the caches with `prompt`; return the logits of its last row only.

    With `cached` > 0 the target cache and the drafter already hold
    `prompt[:cached]` (a reused prompt cache) and only the rest is run.
    `should_stop` is asked before each chunk; when it says so, `Cancelled`
    is raised with the caches consistent up to the chunks already run.
    """
    if not 0 <= cached < len(prompt):
        raise ValueError(f"cached prefix {cached} must be shorter than the prompt")
    if cached == 0:
        drafter.start(prompt)
    logits = None
    for s in range(cached, len(prompt), step_size):
        if should_stop is not None and should_stop():
            raise Cancelled(s)
        chunk = list(prompt[s : s + step_size])
        last = s + step_size >= len(prompt)
        logits, features = target.forward(
            mx.array([chunk]), cache, last_only=True, flush=True
        )
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
    should_stop: Optional[Callable[[], bool]] = None,
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
        block_size: verify block size B (anchor + B-1 drafted tokens); with
          `fallback`, the largest block a cycle verifies.
        stop_tokens: generation ends at the first of these (it is yielded).
        prefill_step_size: prompt chunk size.
        cached: `cache` and `drafter` already hold `prompt[:cached]` (prompt
          cache reuse); only the rest is prefilled.
        sampling: temperature / top-p / top-k / min-p / seed (default greedy).
        logprobs: None, or the number of top log-probabilities to return with
          each token (0 = only the token's own).
        fallback: decode plainly while speculation does not pay, probing
          cheaply when to resume (see `fallback.py`; None = always speculate).
        stats: filled in as cycles complete.
        should_stop: asked between prefill chunks (see `prefill`); the caller
          checks it between yielded tokens itself.

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
        target,
        cache,
        drafter,
        prompt,
        step_size=prefill_step_size,
        cached=cached,
        should_stop=should_stop,
    )
    key, k = mx.random.split(key)
    first = pick(logits, params, k)
    lp = _logprobs(logits, first, logprobs)
    mx.eval(first, lp)
    y = int(first.item())
    yield _out(y, False, lp, 0, logprobs)
    n_out = 1
    if y in stop or n_out >= max_tokens:
        return

    sampled_drafts = not params.greedy and hasattr(drafter, "propose_sampled")
    fb = None
    if fallback is not None and block_size > 1:
        fb = FallbackState(fallback, block_size)

    def start_cycle(y: int, n_out: int):
        """Draft the next cycle and start it on the device, so the draft runs
        while the host hands out tokens and builds the verify graph."""
        nonlocal key
        plain = fb is not None and fb.plain
        block = block_size if fb is None else fb.block
        # Never verify more than can still be emitted: exact max_tokens, less work.
        n_draft = 0 if plain else min(block, max_tokens - n_out) - 1
        key, k_draft, k_accept = mx.random.split(key, 3)
        q = None
        if n_draft == 0:
            draft = mx.array([], mx.uint32)
        elif sampled_drafts:
            draft, q = drafter.propose_sampled(y, n_draft, params, k_draft)
        else:
            draft = drafter.propose(y, n_draft)
        draft = draft.astype(mx.uint32)
        # A fallback probe drafts without verifying; later plain steps check it.
        probe = drafter.propose(y, fb.probe - 1) if plain and fb.probe_now else None
        pending = [x for x in (draft, q, probe) if x is not None and x.size]
        if pending:
            mx.async_eval(pending)
        return plain, draft, q, probe, k_accept

    def plain_step(x: mx.array):
        """One plain step on the (lazy) token `x`, queued on the device."""
        nonlocal key
        logits, features = target.forward(x.reshape(1, 1), cache)
        k = None
        if not params.greedy:
            key, k = mx.random.split(key)
        t = pick(logits[0, -1], params, k).astype(mx.uint32)
        mx.async_eval(t)
        return t, features

    tic = time.perf_counter()
    cycle = start_cycle(y, n_out)
    while True:
        plain, draft, q, probe, k_accept = cycle
        # --- plain stretch: no decision until its probe step, so pipeline it
        n_run = (
            min(fb.plain_run, max_tokens - n_out) if plain and logprobs is None else 0
        )
        if n_run:
            # mlx_lm's own loop: step t+1 is queued before step t's token is read.
            emitted, feats = [], []
            nxt, f = plain_step(mx.array(y, mx.uint32))
            for i in range(n_run):
                cur = nxt
                feats.append(f)
                if i + 1 < n_run:
                    saved = snapshot(cache, target.delta_taps)
                    nxt, f = plain_step(cur)
                t = cur.item()
                emitted.append(t)
                last = t in stop or i + 1 == n_run
                if last:  # account before the last yield: the caller may stop there
                    if i + 1 < n_run:  # undo the step queued after the stop token
                        rollback(cache, target.delta_taps, saved, verified=1, kept=0)
                    drafter.commit(
                        [y] + emitted[:-1],
                        None if f is None else mx.concatenate(feats, axis=1),
                    )
                    now = time.perf_counter()
                    stats.plain_tokens += len(emitted)
                    stats.plain_seconds += now - tic
                    fb.after_plain_run(len(emitted), now - tic)
                    n_out += len(emitted)
                    y = t
                yield _out(t, False, None, 0, None)
                if last:
                    break
            if y in stop or n_out >= max_tokens:
                return
            tic = time.perf_counter()
            cycle = start_cycle(y, n_out)
            continue

        verify_in = mx.concatenate([mx.array([y], dtype=mx.uint32), draft])
        saved = snapshot(cache, target.delta_taps)
        logits, features = target.forward(verify_in[None], cache, flush=True)
        logits = logits[0]
        if params.greedy:
            candidates = mx.argmax(logits, axis=-1)
            accepted = draft == candidates[:-1]
        else:
            p = probs(logits, params)
            accepted, candidates = speculative_accept(draft, q, p, k_accept)
        lp = _logprobs(logits, candidates, logprobs, draft)

        # --- accept: the one host sync of the cycle
        mx.eval(accepted, candidates, draft, lp, probe)
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
            stats.plain_tokens += m
            stats.plain_seconds += now - tic
            probe = None if probe is None else probe.tolist()
            fb.after_plain(now - tic, emitted[0], probe, stats)
        else:
            stats.record(drafted=len(draft), accepted=min(a, m), emitted=m)
            stats.spec_seconds += now - tic
            if fb is not None:
                fb.after_spec(len(draft) + 1, min(a, m), m, now - tic, stats)

        n_out += m
        y = emitted[-1]
        done = y in stop or n_out >= max_tokens
        tic = time.perf_counter()
        if not done:
            cycle = start_cycle(y, n_out)
        for i, t in enumerate(emitted):
            yield _out(t, i < a, lp, i, logprobs, from_draft_row=i < a)
        if done:
            return


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
