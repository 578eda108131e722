"""Prompt cache across requests: reuse the longest cached prefix of a new prompt.

An entry is a target cache (one per layer) plus the drafter's state, both
holding exactly `tokens`. Attention-only caches can be trimmed back to any
shorter prefix; a GatedDeltaNet layer (`ArraysCache`) cannot, so such an entry
only serves prompts that start with all of its tokens. That is why the engine
also stores a snapshot at the end of each prompt for those models. Entries are
evicted least recently used first to stay within a byte budget. Each entry
belongs to one key (the client's API key): a client reuses, and its
`cached_tokens` reveal, only prompts sent with the same key.
"""

import copy
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

# Plain-data attributes that hold a drafter's committed context (see drafters.py).
_DRAFTER_STATE = ("cache", "tokens", "length", "cycle")

# Claude Code puts a per-request nonce line in system[0] and a changing
# `<total_tokens>` marker in reminders; either one at the front of the prompt
# would defeat prefix reuse. Neither carries meaning for a local model, so we
# remove both from the text before it is templated and tokenised.
_BILLING = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(\n|$)", re.MULTILINE)
_TOTAL_TOKENS = re.compile(r"<total_tokens>.*?</total_tokens>\n?", re.DOTALL)


def normalize_text(text: str) -> str:
    """Drop the Claude Code billing-header line and `<total_tokens>…</total_tokens>`."""
    return _TOTAL_TOKENS.sub("", _BILLING.sub("", text))


def save_drafter(drafter, *, copy_state: bool) -> dict:
    state = {k: getattr(drafter, k) for k in _DRAFTER_STATE if hasattr(drafter, k)}
    return copy.deepcopy(state) if copy_state else state


def load_drafter(drafter, state: dict):
    for k, v in state.items():
        setattr(drafter, k, v)


def _nbytes(obj) -> int:
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(o) for o in obj.values())
    return int(getattr(obj, "nbytes", 0) or 0)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class Entry:
    tokens: Tuple[int, ...]
    cache: List[Any]
    drafter_state: dict
    nbytes: int
    trimmable: bool
    key: Optional[str] = None


class PromptCache:
    """LRU store of (tokens -> target cache + drafter state) within `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: "OrderedDict[int, Entry]" = OrderedDict()
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self):
        return len(self._entries)

    def fetch(
        self, prompt: Sequence[int], key: Optional[str] = None
    ) -> Tuple[Optional[Entry], int, int]:
        """The entry that covers the longest prefix of `prompt`, for the caller to own.

        Returns `(entry, reuse, trim)`: the caller must trim `trim` tokens off
        its cache and drafter, leaving `reuse` tokens (< len(prompt): the last
        prompt row must be run for logits). An entry the request reuses
        (nearly) whole is taken out: the caller extends it and inserts it
        back, as in an agent's next turn. One that would lose more than a
        tenth is copied, so a conversation that shares only a prefix with it
        (a template header, a system prompt) doesn't destroy it.
        `(None, 0, 0)` when nothing helps. Only entries stored under `key`
        are considered.
        """
        best, best_n = None, 0
        for i, e in self._entries.items():
            if e.key != key:
                continue
            c = min(_common_prefix(e.tokens, prompt), len(prompt) - 1)
            n = c if e.trimmable else (len(e.tokens) if len(e.tokens) <= c else 0)
            if n > best_n:
                best, best_n = i, n
        if best is None:
            return None, 0, 0
        entry = self._entries[best]
        trim = len(entry.tokens) - best_n
        if trim * 10 > len(entry.tokens):
            self._entries.move_to_end(best)
            entry = copy.deepcopy(entry)
        else:
            del self._entries[best]
        return entry, best_n, trim

    def insert(
        self,
        tokens: Sequence[int],
        cache: List[Any],
        drafter_state: dict,
        key: Optional[str] = None,
    ):
        """Store an entry (owned by the store from now on) and evict to the budget."""
        trimmable = all(c.is_trimmable() for c in cache)
        nbytes = _nbytes(cache) + _nbytes(drafter_state)
        tokens = tuple(tokens)
        same = [i for i, e in self._entries.items() if e.tokens == tokens and e.key == key]
        for i in same:
            del self._entries[i]
        if nbytes > self.max_bytes or not tokens:
            return
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            self._entries.popitem(last=False)
        self._entries[self._next] = Entry(
            tokens, cache, drafter_state, nbytes, trimmable, key
        )
        self._next += 1

    def clear(self):
        self._entries.clear()
