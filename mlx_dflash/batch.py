"""Batched speculative decoding: several requests verified in one target forward.

Each row is a request with its own `Decoding` (decode.py): its drafter, PRNG
key, sampling settings, stop tokens, `max_tokens`, fallback and stats. A cycle
drafts for every row (the DFlash rows in one batched draft forward,
`drafters.prefetch`; proposed at the end of the cycle before, so the drafts
run while the caller hands out its tokens), verifies every row's
`[anchor, draft]` in ONE target forward over a `RaggedCache` (ragged.py;
rows with shorter blocks are padded at the end), reads every row's
acceptance in one host sync, rolls each row back to its own kept length
(`rollback_rows`), and writes every DFlash row's newly kept context into its
drafter in one draft pass (`drafters.precommit`). Rows join between cycles
after a prefill of their own (the one-row `prefill`, chunk by chunk with a
cycle of the others between two chunks; then their caches become a row of
the batch) and leave when done or when the caller lets them go. A row's
tokens are its solo `generate_step`'s: greedy token for token, sampled with
the same draws for the same seed (the row's key is split exactly as the solo
run splits it).

The block kernels (kernels/) take a batched block of up to 64 rows in all
(B rows x L) as one block of rows (`kernels.attention.is_block`); flash.py's
attention is one-row only, so batched attention is MLX's with the ragged mask.
"""

import copy
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Iterable, List, Optional, Sequence, Tuple

import mlx.core as mx

from .decode import Decoding, check_request, prefill
from .drafters import Drafter, precommit, prefetch
from .fallback import Fallback
from .ragged import RaggedCache, RaggedKVCache
from .rollback import rollback, rollback_row, rollback_rows, snapshot
from .sampling import SamplingParams
from .starts import together
from .stats import SpecStats
from .target import Target

PAD = 0  # the token of a short block's padding positions (their outputs are unused)
WAIT = "wait"  # what `Batch.steps` yields while its row waits for the next cycle


@dataclass(eq=False)
class Row:
    """One request in a `Batch`; `tag` is the caller's."""

    decoding: Decoding
    tag: Any = None
    # The latest cycle's outputs not yet taken by the reader of `steps`
    # (None: a row joined by `join`, whose caller takes `step`'s return).
    outbox: Optional[Deque[tuple]] = None
    final: Optional[List[Any]] = None  # its caches, once done and gone
    # Its latest cycle: (the batch's cycle count, its batch row, positions kept).
    last: Tuple[int, int, int] = (0, 0, 0)
    # Its next cycle, already proposed (on the device while outputs go out).
    cycle: Any = None

    @property
    def done(self) -> bool:
        return self.decoding.done


class RowCache:
    """Layer `i` of a batch row's caches, read where they are now: the row's
    own one-row caches (a batch of one), its row of the batch's, or its
    caches once done. `Batch.steps` puts these in the caller's cache list
    while the row decodes, so a reader of that list (the prompt cache's
    cut-point recorder) sees the row's `offset` and copies its states
    (`copy.deepcopy` gives a one-row cache of the model's own kind)."""

    def __init__(self, batch: "Batch", row: Row, i: int):
        self.batch, self.row, self.i = batch, row, i

    def _solo(self):
        """The layer's one-row cache, or None while it is a row of the batch's."""
        r = self.row
        if r.decoding.cache is not None:
            return r.decoding.cache[self.i]
        if r not in self.batch.rows:
            return r.final[self.i]
        return None

    @property
    def offset(self) -> int:
        solo = self._solo()
        if solo is not None:
            return solo.offset
        layer = self.batch.cache.layers[self.i]
        if not isinstance(layer, RaggedKVCache):
            raise AttributeError("a recurrent layer has no offset")
        return layer.lengths[self.batch.rows.index(self.row)]

    def is_trimmable(self) -> bool:
        solo = self._solo()
        layer = solo if solo is not None else self.batch.cache.layers[self.i]
        return isinstance(layer, RaggedKVCache) or layer.is_trimmable()

    def __deepcopy__(self, memo):
        solo = self._solo()
        if solo is not None:
            return copy.deepcopy(solo, memo)
        return self.batch.cache.row_layer(self.i, self.batch.rows.index(self.row))


class Batch:
    """Rows decoded together, one verify forward per cycle (module docstring).

    Args:
        target: the target model adapter, shared by every row.
        prefill_step_size: prompt chunk size of a joining row's prefill.
    """

    def __init__(self, target: Target, *, prefill_step_size: int = 2048):
        self.target = target
        self.prefill_step_size = prefill_step_size
        self.cache = RaggedCache()
        self.rows: List[Row] = []
        self.cycles = 0
        # The latest verify's pre-verify states and width (a row taken out
        # part way through its outputs is rolled back from them).
        self._saved, self._width = {}, 0

    def __len__(self) -> int:
        return len(self.rows)

    def join(self, prompt: Sequence[int], drafter: Drafter, **options):
        """`joining` run to its end at once (nobody else runs between chunks):
        (row, its first output)."""
        steps = self.joining(prompt, drafter, **options)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def joining(
        self,
        prompt: Sequence[int],
        drafter: Drafter,
        *,
        sampling: Optional[SamplingParams] = None,
        block_size: int = 16,
        max_tokens: int = 256,
        stop_tokens: Iterable[int] = (),
        logprobs: Optional[int] = None,
        fallback: Optional[Fallback] = None,
        stats: Optional[SpecStats] = None,
        cache: Optional[List[Any]] = None,
        cached: int = 0,
        prefill_step_size: Optional[int] = None,
        should_stop: Optional[Callable[[], bool]] = None,
        tag: Any = None,
    ):
        """Prefill `prompt` alone, then decode it with the batch: a generator
        that yields `WAIT` between prefill chunks while the batch has rows
        (the caller runs a `step()` there, so they keep streaming) and returns
        the row and its first token as `generate_step` yields it.

        The options are `generate_step`'s; `drafter` is this row's own (a
        drafter holds one sequence's context). `cache` (a one-row cache
        holding `prompt[:cached]`, default a fresh one) is taken over by the
        batch. A row done after its first token (a stop, `max_tokens` 1) does
        not join. `prefill_step_size` overrides the batch's for this prompt;
        `should_stop` is asked before each chunk (`Cancelled`, as `prefill`).
        """
        check_request(prompt, block_size, cached)
        cache = self.target.make_cache() if cache is None else cache
        step = prefill_step_size or self.prefill_step_size
        # One chunk per call: the same chunks, hence the same caches, as one
        # call would run; between two, the batch's rows run a cycle.
        for start in range(cached, len(prompt), step):
            if start > cached and self.rows:
                yield WAIT
            logits = prefill(
                self.target,
                cache,
                drafter,
                prompt[: start + step],
                step_size=step,
                cached=start,
                should_stop=should_stop,
            )
        d = Decoding(
            self.target,
            cache,
            drafter,
            sampling=sampling,
            block_size=block_size,
            max_tokens=max_tokens,
            stop_tokens=stop_tokens,
            logprobs=logprobs,
            fallback=fallback,
            stats=stats,
        )
        first = d.first_token(logits)
        row = Row(d, tag)
        if not d.done:
            if self.rows:
                self._to_ragged()
                self.cache.add(d.cache)
                d.cache = None  # the batch holds it now
            self.rows.append(row)
        return row, first

    # A batch of one row decodes over that row's own one-row cache (its
    # `decoding.cache`), as `generate_step` does: the one-row kernels (flash.py
    # attention over a `BucketKVCache`) apply, so one stream is no slower in a
    # batch. A second row moves it into the `RaggedCache`; back to one row,
    # the survivor moves out again (a copy of its K/V each way).

    def _solo(self) -> bool:
        return len(self.rows) == 1 and self.rows[0].decoding.cache is not None

    def _to_ragged(self):
        if self._solo():
            d = self.rows[0].decoding
            self.cache.add(d.cache)
            d.cache = None

    def _caches_of(self, b: int) -> List[Any]:
        """Row b's caches as a one-row cache list (a copy from the batch's)."""
        d = self.rows[b].decoding
        return d.cache if d.cache is not None else self.cache.row(b)

    def step(self) -> List[Tuple[Row, List[tuple]]]:
        """One cycle of every row; returns each row's new outputs (as
        `generate_step` yields them). Rows done after it have left."""
        assert self.rows, "an empty batch has no cycle"
        rows = self.rows
        self._propose([r for r in rows if r.cycle is None])  # rows new since
        cycles = [r.cycle for r in rows]
        for r in rows:
            r.cycle = None
        width = max(1 + c.draft.size for c in cycles)
        blocks = []
        for r, c in zip(rows, cycles):
            pad = mx.full((width - 1 - c.draft.size,), PAD, mx.uint32)
            blocks.append(
                mx.concatenate([mx.array([r.decoding.y], mx.uint32), c.draft, pad])
            )
        solo = self._solo()
        layers = rows[0].decoding.cache if solo else self.cache.layers
        taps = self.target.delta_taps
        saved = snapshot(layers, taps)
        logits, features = self.target.forward(mx.stack(blocks), layers, flush=True)
        judged = [
            r.decoding.judge(c, logits[b, : 1 + c.draft.size])
            for b, (r, c) in enumerate(zip(rows, cycles))
        ]
        mx.eval(judged)  # the one host sync
        verdicts = [r.decoding.verdict(c, j) for r, c, j in zip(rows, cycles, judged)]
        kept = [len(v.tokens) for v in verdicts]
        if solo:
            rollback(layers, taps, saved, verified=width, kept=kept[0])
        else:
            rollback_rows(layers, taps, saved, verified=width, kept=kept)
        self._saved, self._width = saved, width
        self.cycles += 1
        if features is not None:
            # Every DFlash row's new context K/V in one pass (two rows or
            # more); each row's commit takes its own.
            precommit([r.decoding.drafter for r in rows], kept, features)
        out = []
        with together():  # the rows' context K/V, started in one call
            for b, (r, c, v) in enumerate(zip(rows, cycles, verdicts)):
                r.decoding.record(c, v, None if features is None else features[b : b + 1])
        for b, (r, c, v) in enumerate(zip(rows, cycles, verdicts)):
            outputs = list(r.decoding.hand_out(v))
            if r.outbox is not None:
                assert not r.outbox, "a row's outputs were not taken before a cycle"
                r.outbox.extend(outputs)
            r.last = (self.cycles, b, kept[b])
            if r.done:
                r.final = self._caches_of(b)
            out.append((r, outputs))
        self._drop([r for r in rows if r.done])
        # The next cycle's drafts start now, while the caller hands these
        # outputs out (as generate_step proposes before it yields).
        self._propose(self.rows)
        return out

    def _propose(self, rows: List[Row]):
        """Each row's next cycle, the DFlash rows' drafts in one forward (each
        row's `propose` takes its own)."""
        if not rows:
            return
        ds = [r.decoding for r in rows]
        prefetch([d.drafter for d in ds], [d.y for d in ds], [d.draft_size() for d in ds])
        with together():  # every row's draft started in one call
            for r in rows:
                r.cycle = r.decoding.propose()

    def steps(
        self,
        target: Target,
        prompt: Sequence[int],
        drafter: Drafter,
        *,
        cache: Optional[List[Any]] = None,
        **options,
    ):
        """A row of this batch behind `generate_step`'s signature and yields.

        Between its outputs it yields `WAIT` while the row waits for the
        batch's next cycle; the caller runs `step()` once every row it drives
        waits (or is done), and takes each row's outputs before the next one.
        `cache` (a list) holds `prompt + output[:-1]` when the generator ends
        or is closed, as `generate_step` leaves it: the row leaves the batch
        and its caches go back into that list.
        """
        assert target is self.target, "a batch decodes for its own target"
        cache = self.target.make_cache() if cache is None else cache
        row, first = yield from self.joining(prompt, drafter, cache=cache, **options)
        row.outbox = deque()
        if row in self.rows:
            if row.decoding.cache is cache:  # a batch of one: its own caches
                row.decoding.cache = list(cache)
            # The batch holds them (or its own copy); meanwhile the caller's
            # list shows where they are (`RowCache`).
            cache[:] = [RowCache(self, row, i) for i in range(len(cache))]
        try:
            yield first
            while True:
                while row.outbox:
                    yield row.outbox.popleft()
                if row.done or row not in self.rows:
                    return
                yield WAIT
        finally:
            self._settle(row, cache)

    def _settle(self, row: Row, cache: List[Any]):
        """`row` leaves; `cache` gets its caches, less the outputs not taken."""
        if row in self.rows:
            solo = self.leave(row)
        elif row.final is not None:
            solo = row.final
        else:
            return  # done at its first token: `cache` is its prefill's
        untaken = len(row.outbox)
        if untaken:
            # Rolled back from the latest cycle's captures and snapshot: the
            # untaken outputs must be that cycle's.
            cycle, b, held = row.last
            assert cycle == self.cycles, "a row's outputs were not taken before a cycle"
            rollback_row(
                solo,
                self.target.delta_taps,
                self._saved,
                row=b,
                verified=self._width,
                held=held,
                kept=held - untaken,
            )
            row.decoding.drafter.trim(untaken)
            row.outbox.clear()
        cache[:] = solo

    def leave(self, row: Row) -> List[Any]:
        """`row` leaves the batch (a cancel); returns its caches as a one-row
        cache list holding `prompt + output[:-1]`, as plain decoding would."""
        solo = self._caches_of(self.rows.index(row))
        self._drop([row])
        return solo

    def _drop(self, gone: List[Row]):
        if not gone:
            return
        stay = [b for b, r in enumerate(self.rows) if r not in gone]
        if not self._solo():
            self.cache.keep(stay)
        self.rows = [self.rows[b] for b in stay]
        if len(self.rows) == 1 and self.rows[0].decoding.cache is None:
            # Back to one row: it decodes over its own caches.
            self.rows[0].decoding.cache = self.cache.row(0)
            self.cache.keep([])
