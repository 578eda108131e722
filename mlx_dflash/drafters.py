"""Drafters: anything that proposes the next tokens for the target to verify.

The decode loop talks to a drafter through three calls, in this order:
  start(prompt)            a new sequence begins
  commit(tokens, features) tokens now in the target cache, with the target's
                           captured layer outputs for them (prefill chunks and
                           accepted verify positions)
  propose(anchor, n)       up to n tokens that should follow `anchor`
`capture_layers` names the target layers whose outputs `commit` needs.
`trim(n)` forgets the last n committed tokens. `state()` is the committed
context as plain data (live, not a copy: `copy.deepcopy` it to snapshot) and
`load_state(state)` puts such a state back: the prompt cache stores and
restores drafters through these two.
"""

import copy
import random
from typing import Optional, Protocol, Sequence

import mlx.core as mx

from .draft import DFlashDraft, StackedContext
from .lookup import LookupAssist, NgramIndex
from .sampling import sample_draft
from .starts import start_eval
from .target import Target


class Drafter(Protocol):
    name: str
    capture_layers: Sequence[int]

    def start(self, prompt: Sequence[int]) -> None: ...

    def commit(self, tokens: Sequence[int], features: Optional[mx.array]) -> None: ...

    def propose(self, anchor: int, n: int) -> mx.array: ...

    def trim(self, n: int) -> None: ...

    def state(self) -> dict: ...

    def load_state(self, state: dict) -> None: ...


class DFlashDrafter:
    """Block-diffusion drafting: one pass of the draft model per block."""

    name = "dflash"

    def __init__(
        self,
        draft: DFlashDraft,
        target: Target,
        vocab: Optional[Sequence[int]] = None,
        lookup: Optional[LookupAssist] = None,
    ):
        """`vocab`: the token ids the draft may propose (None: all). The
        draft's head then reads only their rows of the target's LM head,
        which at a 49k-150k vocabulary is much of a draft pass's work; the
        output stays the target's own (a token outside `vocab` is simply
        never drafted, and the verify finds the target's token there).
        `lookup`: let prompt lookup's continuation replace the drafts where
        it starts with the first draft or a long enough tail recurs
        (lookup.py; None: the drafts alone)."""
        self.draft = draft
        self.lookup = lookup
        self.index = NgramIndex(lookup.max_match) if lookup else None
        self.target = target
        self.vocab = None if vocab is None else mx.array(sorted(set(vocab)), mx.uint32)
        self._head = None if vocab is None else target.head_rows(self.vocab)
        self.capture_layers = list(draft.args.target_layer_ids)
        self.mask_token_id = draft.args.mask_token_id
        self.block_size = draft.args.block_size
        self.cache = draft.make_cache()
        # The draft's blocks take the target's block path (kernels/).
        self.fitting = target.path.fit_draft(draft)
        # Start every n-th layer of a draft pass while the rest is built (0: off).
        self.flush_every = target.path.draft_flush_every
        # (anchor, n, logits) that `prefetch` drafted for the next proposal.
        self.ready = None
        # (n, [(keys, values) per layer]) that `precommit` made for the next commit.
        self.ready_kv = None

    def fresh(self) -> "DFlashDrafter":
        """A drafter of the same draft, fitting and vocabulary, with no context."""
        d = copy.copy(self)
        d.start(None)
        return d

    def start(self, prompt):
        self.cache, self.ready, self.ready_kv = self.draft.make_cache(), None, None
        self.index = NgramIndex(self.lookup.max_match) if self.lookup else None

    def commit(self, tokens, features):
        if self.index is not None:
            self.index.extend(tokens)
        self.ready = None  # drafted on the context before these tokens
        kv, self.ready_kv = self.ready_kv, None
        if kv is not None and kv[0] == len(tokens):  # `precommit` computed them
            for c, (k, v) in zip(self.cache, kv[1]):
                c.update_and_fetch(k, v)
        else:
            with self.fitting:
                self.draft.append_context(features, self.cache)
        # Start it now: the step that committed pays for it, not the next
        # proposal (whose time the fallback weighs).
        start_eval([c.state for c in self.cache])

    def trim(self, n):
        self.ready = self.ready_kv = None
        for c in self.cache:
            c.trim(n)
        if self.index is not None:
            self.index.trim(n)

    def state(self):
        # The lookup's tokens, not its index: a prompt cache deep-copies
        # states, and rebuilding the index costs about a third of copying it
        # (8k tokens: 30 against 100 ms on this repo's CPU).
        tokens = None if self.index is None else self.index.tokens
        return {"cache": self.cache, "tokens": tokens}

    def load_state(self, state):
        self.cache, self.ready, self.ready_kv = state["cache"], None, None
        self.index = None
        if self.lookup is not None:
            if state.get("tokens") is None:
                raise ValueError("a drafter state without the prompt lookup's tokens")
            self.index = NgramIndex(self.lookup.max_match)
            self.index.extend(state["tokens"])

    @property
    def dflash(self) -> "DFlashDrafter":
        return self

    def _logits(self, anchor: int, n: int) -> mx.array:
        ready, self.ready = self.ready, None
        if ready is not None and ready[:2] == (anchor, n):
            return ready[2]
        block = mx.array([[anchor] + [self.mask_token_id] * n])
        with self.fitting:
            h = self.draft(self.target.embed(block), self.cache, self.flush_every)
        return self.head(h[0, 1:])

    def head(self, h: mx.array) -> mx.array:
        """Logits of hidden states `h`: over the whole vocabulary, or over
        `vocab`'s ids (in their order) with a draft vocabulary."""
        return self.target.logits(h) if self.vocab is None else self._head(h)

    def propose(self, anchor: int, n: int) -> mx.array:
        best = mx.argmax(self._logits(anchor, n), axis=-1)
        # `vocab` is sorted: the first best id is the whole vocabulary's argmax
        # with the other ids' logits at -inf.
        draft = (best if self.vocab is None else self.vocab[best]).astype(mx.uint32)
        if self.lookup is not None:
            draft, _ = self.lookup.merge(self.index, anchor, draft)
        return draft

    def propose_sampled(self, anchor: int, n: int, params, key):
        """Draw the draft from q (same transforms as the target); return (tokens, q)."""
        logits = self._logits(anchor, n)
        if self.vocab is not None:  # q over the whole vocabulary, 0 off `vocab`
            full = mx.full((logits.shape[0], self.target.vocab_size), -mx.inf, logits.dtype)
            full[:, self.vocab] = logits
            logits = full
        draft, q = sample_draft(logits, params, key)
        if self.lookup is not None:
            draft, q = self.lookup.merge(self.index, anchor, draft.astype(mx.uint32), q)
        return draft, q


def _shared_drafts(drafters: Sequence[Drafter], counts: Sequence[int]):
    """The rows (index, DFlash drafter, count > 0) whose drafters run a DFlash
    draft (`.dflash`: a `DFlashDrafter`, or the one inside the bench's engine
    drafter), grouped by draft model; only groups of two rows or more."""
    groups = {}
    for b, (drafter, n) in enumerate(zip(drafters, counts)):
        d = getattr(drafter, "dflash", None)
        if d is not None and n > 0:
            groups.setdefault((id(d.draft), id(d._head)), []).append((b, d, n))
    return [rows for rows in groups.values() if len(rows) > 1]


def prefetch(
    drafters: Sequence[Drafter], anchors: Sequence[int], counts: Sequence[int]
) -> None:
    """Draft several rows' blocks in one forward (batch.py's cycle).

    Row b's drafter is about to propose counts[b] tokens after anchors[b].
    The rows whose drafters run the same DFlash draft share one batched
    forward (`StackedContext`); each row's next proposal then takes its own
    rows of the logits instead of a forward of its own, so the drafts are
    what the row's own forward would have made.
    """
    for rows in _shared_drafts(drafters, counts):
        first, width = rows[0][1], 1 + max(n for _, _, n in rows)
        block = mx.array(
            [[anchors[b]] + [first.mask_token_id] * (width - 1) for b, _, _ in rows]
        )
        sizes = [1 + n for _, _, n in rows]
        shared = {}  # every layer's context has the same lengths
        caches = [
            StackedContext([d.cache[i] for _, d, _ in rows], sizes, shared)
            for i in range(len(first.cache))
        ]
        with first.fitting:
            h = first.draft(first.target.embed(block), caches, first.flush_every)
        logits = first.head(h[:, 1:])
        for g, (b, d, n) in enumerate(rows):
            d.ready = (anchors[b], n, logits[g, :n])


def precommit(drafters: Sequence[Drafter], kept: Sequence[int], features: mx.array):
    """Several rows' context K/V in one draft pass (batch.py's cycle).

    Row b of `features` (B, width, F: one batched verify's captures) holds
    drafter b's newly committed positions, the first kept[b] of them. The
    rows whose drafter runs a DFlash draft (`.dflash`) on the same model get
    one projection and one K/V pass for all; each one's next `commit` of
    kept[b] tokens writes its own rows of them instead of a pass of its own.
    """
    for rows in _shared_drafts(drafters, kept):
        first = rows[0][1]
        which = [b for b, _, _ in rows]
        # Every row of the batch in order (the usual case) needs no gather.
        whole = which == list(range(features.shape[0]))
        feats = features if whole else features[mx.array(which)]
        kvs = [[] for _ in rows]
        # Every layer holds the same context: one offset per row.
        offset = mx.array([d.cache[0].offset for _, d, _ in rows], mx.int32)
        with first.fitting:
            ctx = first.draft.project(feats)
            for layer in first.draft.layers:
                k, v = layer.self_attn.kv(ctx, offset)
                for g, (_, _, m) in enumerate(rows):
                    kvs[g].append((k[g : g + 1, :, :m], v[g : g + 1, :, :m]))
        for (_, d, m), kv in zip(rows, kvs):
            d.ready_kv = (m, kv)


class PromptLookupDrafter:
    """N-gram match of the latest tokens against prompt + generated text
    (lookup.py), the most recent occurrence first: recent text predicts best
    in edits and agent turns."""

    name = "lookup"
    capture_layers = ()

    def __init__(self, ngram_max: int = 4, ngram_min: int = 1):
        self.ngram_min = ngram_min
        self.index = NgramIndex(ngram_max)

    def start(self, prompt):
        self.index = NgramIndex(self.index.max_n)

    def commit(self, tokens, features):
        self.index.extend(tokens)

    def trim(self, n):
        self.index.trim(n)

    def state(self):
        return {"tokens": self.index.tokens}

    def load_state(self, state):
        self.index = NgramIndex(self.index.max_n)
        self.index.extend(state["tokens"])

    def propose(self, anchor: int, n: int) -> mx.array:
        follow, _ = self.index.continuation(anchor, n, self.ngram_min)
        return mx.array(follow, dtype=mx.uint32)


class OracleDrafter:
    """Replays a known continuation, corrupting tokens on purpose.

    Args:
        reference: the full expected sequence (prompt + the target's output).
        error_rate: chance that each drafted token is wrong.
        vocab_size: the target's vocabulary size (wrong tokens stay inside it).
        schedule: alternatively, per cycle the draft index of the first wrong
          token (cycled; an index >= n means the whole draft is right).
    """

    name = "oracle"
    capture_layers = ()

    def __init__(
        self,
        reference: Sequence[int],
        *,
        error_rate: float = 0.0,
        vocab_size: int,
        schedule: Optional[Sequence[int]] = None,
        seed: int = 0,
    ):
        self.reference = list(reference)
        self.error_rate = error_rate
        self.schedule = list(schedule) if schedule else None
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.length = 0
        self.cycle = 0

    def start(self, prompt):
        self.length = 0
        self.cycle = 0

    def commit(self, tokens, features):
        self.length += len(tokens)

    def trim(self, n):
        self.length -= n

    def state(self):
        return {"length": self.length, "cycle": self.cycle}

    def load_state(self, state):
        self.length, self.cycle = state["length"], state["cycle"]

    def _wrong(self, token: int) -> int:
        return (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size

    def propose(self, anchor: int, n: int) -> mx.array:
        pos = self.length + 1  # the anchor sits at `length`
        draft = self.reference[pos : pos + n]
        if self.schedule is not None:
            bad = self.schedule[self.cycle % len(self.schedule)]
            if bad < len(draft):
                draft[bad] = self._wrong(draft[bad])
        else:
            draft = [
                self._wrong(t) if self.rng.random() < self.error_rate else t
                for t in draft
            ]
        self.cycle += 1
        return mx.array(draft, dtype=mx.uint32)
