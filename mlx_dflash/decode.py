"""Speculative decoding: prefill -> propose -> verify -> accept -> commit.

Only this module knows the cycle. Each cycle the drafter proposes up to B-1
tokens after the anchor (the last emitted token, not yet in any cache), the
target verifies `[anchor, d1 .. d(B-1)]` in one pass, the longest prefix that
matches the target's own choices is accepted, and the target's token at the
first mismatch is emitted as the bonus. Caches are then rolled back so that
they hold exactly the emitted tokens minus the last one, as plain
autoregressive decoding would. One host sync per cycle. With a `Fallback`
(fallback.py) some steps are plain: a block of the anchor alone, no draft, or
a pipelined `PlainStretch`. Text streaming on top of it is stream.py.
"""

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .drafters import Drafter
from .fallback import Fallback, FallbackState, PlainStretch
from .rollback import hold, put_back, rollback, snapshot
from .sampling import SamplingParams, log_weights, pick, speculative_accept
from .starts import start_eval
from .stats import SpecStats
from .target import Target


class Cancelled(Exception):
    """Prefill stopped between chunks; the caches hold `prompt[:filled]`."""

    def __init__(self, filled: int):
        super().__init__(f"cancelled after {filled} prompt tokens")
        self.filled = filled


def check_request(prompt: Sequence[int], block_size: int, cached: int = 0):
    """The errors a request's own options raise, before any work is done."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not prompt:
        raise ValueError("the prompt is empty")
    if not 0 <= cached < len(prompt):
        raise ValueError(f"cached prefix {cached} must be shorter than the prompt")


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
    # A prefill needs no rollback; the latest verify's captures may (batch.py).
    held = hold(target.delta_taps)
    try:
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
    finally:
        put_back(target.delta_taps, held)
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

    When the generator is exhausted, or closed after any token, `cache` and
    the drafter hold `prompt + output[:-1]` (output: the tokens yielded so
    far), exactly as plain decoding would leave them.

    Yields:
        (token, from_draft) pairs; with `logprobs` set,
        (token, from_draft, (logprob, [(id, logprob), ...])).
    """
    check_request(prompt, block_size, cached)
    d = Decoding(
        target,
        target.make_cache() if cache is None else cache,
        drafter,
        sampling=sampling,
        block_size=block_size,
        max_tokens=max_tokens,
        stop_tokens=stop_tokens,
        logprobs=logprobs,
        fallback=fallback,
        stats=stats,
    )
    try:
        logits = prefill(
            target,
            d.cache,
            drafter,
            prompt,
            step_size=prefill_step_size,
            cached=cached,
            should_stop=should_stop,
        )
        yield d.first_token(logits)
        cycle = None if d.done else d.propose()
        while not d.done:
            stretch = d.plain_stretch(cycle)
            if stretch is not None:
                yield from ((t, False) for t in stretch)
                cycle = None if d.done else d.propose()
                continue
            logits, features, saved = d.verify(cycle)
            verdict = d.accept(cycle, logits)  # the one host sync
            d.commit(cycle, verdict, features, saved)
            # The next draft runs on the device while the host hands these out.
            cycle = None if d.done else d.propose()
            yield from d.hand_out(verdict)
    finally:
        d.rewind()


@dataclass
class Cycle:
    """A cycle's proposal, already started on the device."""

    plain: bool  # a plain step: no draft, the anchor alone is verified
    draft: mx.array  # (n,) uint32, n <= B-1
    q: Optional[mx.array]  # the draft's log-weights, when sampled from it
    probe: Optional[mx.array]  # a fallback probe's draft, checked by plain steps
    key: mx.array  # what the acceptance draws with


@dataclass
class Verdict:
    """The target's answer to a cycle's draft."""

    tokens: List[int]  # to emit: accepted drafts, then the target's own token
    accepted: int  # leading drafts accepted (before the stop / max_tokens cut)
    drafted: int
    lp: Optional[dict]  # see `_logprobs`
    probe: Optional[List[int]]


class Decoding:
    """One generation's state between the steps of `generate_step`: the caches,
    the PRNG key, the fallback's state, the last token `y` (in no cache yet),
    and what `rewind` must undo when the caller stops early."""

    def __init__(
        self,
        target: Target,
        cache: List[Any],
        drafter: Drafter,
        *,
        sampling: Optional[SamplingParams],
        block_size: int,
        max_tokens: int,
        stop_tokens: Iterable[int],
        logprobs: Optional[int],
        fallback: Optional[Fallback],
        stats: Optional[SpecStats],
    ):
        """`sampling` None: greedy; `stats` None: a fresh `SpecStats`."""
        sampling = sampling or SamplingParams()
        stats = SpecStats(block_size) if stats is None else stats
        self.target, self.cache, self.drafter = target, cache, drafter
        self.params, self.block_size, self.max_tokens = sampling, block_size, max_tokens
        self.stop = set(int(t) for t in stop_tokens)
        self.logprobs, self.stats = logprobs, stats
        seed = sampling.seed
        self.key = mx.random.key(
            seed if seed is not None else int.from_bytes(os.urandom(4), "little")
        )
        self.fb = None
        if fallback is not None and block_size > 1:
            self.fb = FallbackState(fallback, block_size)
        self.sampled_drafts = not sampling.greedy and hasattr(
            drafter, "propose_sampled"
        )
        self.y: Optional[int] = None
        self.n_out = 0
        self.tic = 0.0  # when the current step began (the fallback weighs it)
        # The caches hold `held` positions of a cycle of which the caller has
        # `handed`; or a plain stretch, which settles itself.
        self.pending: Optional[PlainStretch] = None
        self.held = self.handed = 0
        self.saved: Optional[dict] = None

    @property
    def done(self) -> bool:
        return self.y in self.stop or self.n_out >= self.max_tokens

    def advance(self, tokens: List[int]):
        self.n_out += len(tokens)
        self.y = tokens[-1]

    def first_token(self, logits: mx.array) -> tuple:
        """The target's own choice after the prompt (caches hold the prompt)."""
        self.key, k = mx.random.split(self.key)
        first = pick(logits, self.params, k)
        lp = _logprobs(logits, first, self.logprobs)
        mx.eval(first, lp)
        self.advance([int(first.item())])
        return _out(self.y, False, lp, 0, self.logprobs)

    def propose(self) -> Cycle:
        """Draft the next cycle and start it on the device, so the draft runs
        while the host hands out tokens and builds the verify graph."""
        self.tic = time.perf_counter()
        fb = self.fb
        plain = fb is not None and fb.plain
        n_draft = self.draft_size()
        self.key, k_draft, k_accept = mx.random.split(self.key, 3)
        q = None
        if n_draft == 0:
            draft = mx.array([], mx.uint32)
        elif self.sampled_drafts:
            draft, q = self.drafter.propose_sampled(
                self.y, n_draft, self.params, k_draft
            )
        else:
            draft = self.drafter.propose(self.y, n_draft)
        draft = draft.astype(mx.uint32)
        # A fallback probe drafts without verifying; later plain steps check it.
        probe = None
        if plain and fb.probe_now:
            probe = self.drafter.propose(self.y, fb.probe - 1)
        pending = [x for x in (draft, q, probe) if x is not None and x.size]
        if pending:
            start_eval(pending)
        return Cycle(plain, draft, q, probe, k_accept)

    def draft_size(self) -> int:
        """How many tokens the next `propose` drafts (0: a plain step)."""
        fb = self.fb
        if fb is not None and fb.plain:
            return 0
        block = self.block_size if fb is None else fb.block
        # Never verify more than can still be emitted: exact max_tokens, less work.
        return min(block, self.max_tokens - self.n_out) - 1

    def plain_stretch(self, cycle: Cycle) -> Optional[PlainStretch]:
        """The plain steps ahead that need no decision in between, if any
        (run pipelined; with logprobs, plain steps go one at a time)."""
        if not cycle.plain or self.logprobs is not None:
            return None
        n = min(self.fb.plain_run, self.max_tokens - self.n_out)
        if n == 0:
            return None
        self.pending = PlainStretch(self, n)
        return self.pending

    def plain_step(self, x: mx.array) -> Tuple[mx.array, Optional[mx.array]]:
        """One plain step on the (lazy) token `x`, queued on the device."""
        logits, features = self.target.forward(x.reshape(1, 1), self.cache)
        k = None
        if not self.params.greedy:
            self.key, k = mx.random.split(self.key)
        t = pick(logits[0, -1], self.params, k).astype(mx.uint32)
        mx.async_eval(t)
        return t, features

    def verify(self, cycle: Cycle):
        """One target pass over `[anchor, draft]`: its logits and captured
        features, and the recurrent states from before it (for `rollback`)."""
        tokens = mx.concatenate([mx.array([self.y], dtype=mx.uint32), cycle.draft])
        saved = snapshot(self.cache, self.target.delta_taps)
        logits, features = self.target.forward(tokens[None], self.cache, flush=True)
        return logits[0], features, saved

    def accept(self, cycle: Cycle, logits: mx.array) -> Verdict:
        """The longest accepted draft prefix and the target's token after it,
        cut at a stop token and at `max_tokens`. Reads the device once."""
        judged = self.judge(cycle, logits)
        mx.eval(*judged)
        return self.verdict(cycle, judged)

    def judge(self, cycle: Cycle, logits: mx.array) -> tuple:
        """The target's answer to `cycle` as device arrays, not yet read
        (batch.py reads every row's at once): accepted, candidates, draft,
        logprobs and the probe."""
        draft = cycle.draft
        if self.params.greedy:
            candidates = mx.argmax(logits, axis=-1)
            accepted = draft == candidates[:-1]
        else:
            w = log_weights(logits, self.params)
            accepted, candidates = speculative_accept(draft, cycle.q, w, cycle.key)
        lp = _logprobs(logits, candidates, self.logprobs, draft)
        return accepted, candidates, draft, lp, cycle.probe

    def verdict(self, cycle: Cycle, judged: tuple) -> Verdict:
        """`judge`'s arrays, evaluated, read into a `Verdict`."""
        accepted, candidates, draft, lp, probe = judged
        accepted, candidates = accepted.tolist(), candidates.tolist()
        draft = draft.tolist()
        a = 0
        while a < len(draft) and accepted[a]:
            a += 1
        tokens = draft[:a] + [candidates[a]]
        for i, t in enumerate(tokens):
            if t in self.stop:
                tokens = tokens[: i + 1]
                break
        tokens = tokens[: self.max_tokens - self.n_out]
        probe = None if probe is None else probe.tolist()
        return Verdict(tokens, a, len(draft), lp, probe)

    def commit(self, cycle: Cycle, v: Verdict, features, saved):
        """Caches keep anchor + tokens[:-1]; the drafter gets those positions'
        features; the stats and the fallback hear how the cycle went."""
        m = len(v.tokens)
        verified = v.drafted + 1
        rollback(self.cache, self.target.delta_taps, saved, verified=verified, kept=m)
        self.record(cycle, v, features)
        self.pending, self.saved, self.held, self.handed = None, saved, m, 0

    def record(self, cycle: Cycle, v: Verdict, features):
        """After the caches were rolled back: the drafter gets the kept
        positions' features (`features` (1, >= m, F) or None), the stats and
        the fallback hear how the cycle went, and the tokens count as out."""
        m = len(v.tokens)
        verified = v.drafted + 1
        self.drafter.commit(
            [self.y] + v.tokens[:-1], None if features is None else features[:, :m]
        )
        seconds = time.perf_counter() - self.tic
        accepted = min(v.accepted, m)
        if cycle.plain:
            self.fb.after_plain(seconds, v.tokens[0], v.probe, self.stats)
        else:
            self.stats.record(drafted=v.drafted, accepted=accepted, emitted=m)
            self.stats.spec_seconds += seconds
            if self.fb is not None:
                self.fb.after_spec(verified, accepted, m, seconds, self.stats)
        self.advance(v.tokens)

    def hand_out(self, v: Verdict):
        for i, t in enumerate(v.tokens):
            self.handed = i + 1
            yield _out(t, i < v.accepted, v.lp, i, self.logprobs, i < v.accepted)

    def rewind(self):
        """Leave the caches holding the tokens handed out but the last, as if
        the generation had ended there (a no-op once all are handed out)."""
        if self.pending is not None:
            self.pending.settle()
        elif self.handed < self.held:
            # The verify pass's snapshot and captures are still the latest:
            # roll back again from them, now to the tokens handed out.
            rollback(
                self.cache,
                self.target.delta_taps,
                self.saved,
                verified=self.held,
                kept=self.handed,
            )
            self.drafter.trim(self.held - self.handed)
            self.held = self.handed


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
