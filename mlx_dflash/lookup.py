"""Prompt lookup: what followed the latest earlier occurrence of the text's tail.

Edits, refactors and agent turns repeat much of what is already in the
context (the file being changed, a tool's output, the model's own earlier
lines), and the tokens that followed an earlier occurrence of the last few
tokens are often what comes next. `NgramIndex` finds them in O(1) a lookup
(the end of every 1..`max_n`-gram, kept as tokens are committed and trimmed);
`PromptLookupDrafter` (drafters.py) drafts with it alone, and `LookupAssist`
lets a DFlash drafter's block take that continuation where the two agree on
the first token (drafters.py `DFlashDrafter`). Either way the target verifies
the block, so the output stays the target's own.
"""

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import mlx.core as mx


class NgramIndex:
    """Committed tokens and, for each n-gram (n <= `max_n`) among them, the
    positions where it ends, oldest first."""

    def __init__(self, max_n: int = 4):
        self.max_n = max_n
        self.tokens: List[int] = []
        self.ends: Dict[tuple, List[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            e = len(self.tokens)
            for n in range(1, min(self.max_n, e) + 1):
                self.ends.setdefault(tuple(self.tokens[e - n : e]), []).append(e)

    def trim(self, count: int) -> None:
        """Forget the last `count` tokens (the n-grams ending in them)."""
        for _ in range(min(count, len(self.tokens))):
            e = len(self.tokens)
            for n in range(1, min(self.max_n, e) + 1):
                key = tuple(self.tokens[e - n : e])
                ends = self.ends[key]
                ends.pop()
                if not ends:
                    del self.ends[key]
            self.tokens.pop()

    def continuation(self, anchor: int, count: int, min_n: int = 1) -> Tuple[List[int], int]:
        """`(tokens, n)`: up to `count` tokens that followed the latest earlier
        occurrence of the longest tail (n tokens, `min_n` <= n <= `max_n`) of
        the committed tokens + `anchor`; `([], 0)` when no tail recurs."""
        for n in range(min(self.max_n, len(self.tokens)), min_n - 1, -1):
            tail = tuple(self.tokens[len(self.tokens) - n + 1 :]) + (anchor,)
            ends = self.ends.get(tail)
            if ends:
                e = ends[-1]
                follow = self.tokens[e : e + count]
                if len(follow) < count and e + len(follow) == len(self.tokens):
                    follow = follow + [anchor]  # the occurrence runs into the tail itself
                return follow[:count], n
        return [], 0


@dataclass(frozen=True)
class LookupAssist:
    """When a DFlash block takes prompt lookup's continuation instead of its
    own drafts: a tail of at least `min_match` tokens recurs, and its
    continuation starts with the drafter's own first token, or the tail is
    at least `trust` tokens long (None: agreement always required). The
    drafts after the continuation's end stay the drafter's. The defaults
    ("on") came out ahead, narrowly, of five other settings with the shipped
    pair (bench/results/cpu-prompt-lookup.md)."""

    min_match: int = 1
    max_match: int = 4
    trust: Optional[int] = 3

    @classmethod
    def parse(cls, spec: str) -> Optional["LookupAssist"]:
        """'off' -> None; 'on' -> the defaults; 'MIN' or 'MIN:TRUST'."""
        if spec == "off":
            return None
        if spec == "on":
            return cls()
        head, _, trust = spec.partition(":")
        try:
            m, t = int(head), int(trust) if trust else None
        except ValueError:
            raise ValueError(f"{spec!r}: use on, off, MIN or MIN:TRUST") from None
        if not 1 <= m <= cls.max_match or (t is not None and not m <= t <= cls.max_match):
            raise ValueError(f"{spec!r}: need 1 <= MIN <= TRUST <= {cls.max_match}")
        return cls(min_match=m, trust=t)

    def merge(
        self,
        index: NgramIndex,
        anchor: int,
        draft: mx.array,
        q: Optional[mx.array] = None,
    ) -> Tuple[mx.array, Optional[mx.array]]:
        """`draft` (n,) uint32, with the lookup's continuation in front where
        this assist takes it, chosen on the device (no host sync).

        `q` (the draws' log-weights, when the draft was sampled) follows the
        tokens: a continuation token is a fixed proposal, so its row becomes a
        point mass, which keeps speculative sampling exact; but where the
        continuation is taken because it agrees with the first draw, the first
        token is still that draw, and keeps its own row."""
        n = draft.shape[0]
        follow, size = index.continuation(anchor, n, self.min_match) if n else ([], 0)
        if not follow:
            return draft, q
        k = len(follow)
        cont = mx.array(follow, dtype=mx.uint32)
        merged = mx.concatenate([cont, draft[k:]]) if k < n else cont
        trusted = self.trust is not None and size >= self.trust
        take = None if trusted else draft[0] == cont[0]
        draft = merged if trusted else mx.where(take, merged, draft)
        if q is not None:
            ids = mx.arange(q.shape[-1])[None]
            point = mx.where(ids == cont[:, None], 0.0, -mx.inf).astype(q.dtype)
            if not trusted:
                point = mx.concatenate([q[:1], mx.where(take, point[1:], q[1:k])])
            q = mx.concatenate([point, q[k:]])
        return draft, q


def check_flag(spec: str) -> None:
    """`--prompt-lookup`'s value, checked before any loading ("auto" passes)."""
    if spec != "auto":
        try:
            LookupAssist.parse(spec)
        except ValueError as e:
            raise ValueError(f"--prompt-lookup {e}") from None


def lookup_of(drafter) -> Optional[dict]:
    """A drafter's prompt-lookup assist as results record it (None: off)."""
    assist = getattr(drafter, "lookup", None)
    return None if assist is None else asdict(assist)
