"""Prompt cache across requests: reuse the longest cached prefix of a new prompt.

An entry is a target cache (one per layer) plus the drafter's state, both
holding exactly `tokens`. Attention-only caches can be trimmed back to any
shorter prefix; a GatedDeltaNet layer (`ArraysCache`) cannot, so such an entry
only serves prompts that start with all of its tokens. That is why the engine
also stores a snapshot at the end of each prompt for those models. Entries are
evicted least recently used first to stay within a byte budget. Each entry
belongs to one key (the client's API key): a client reuses, and its
`cached_tokens` reveal, only prompts sent with the same key.

The engine asks this module what to keep: `restore` before a generation,
`snapshot_at`/`snapshot` for the untrimmable prompt[:-1] snapshot, and
`keep_finished`, `keep_cancelled` or `keep` (a prefill stopped part way)
after it. Drafters go in and out through their `state()` / `load_state()`.

A turn's reply is reused by text, not by token ids: the next turn's prompt
renders the reply as text, and a BPE tokenizer need not split that text
into the ids the model generated (nor does an untrimmable cache survive the
first id that differs). An entry made by a chat request keeps the text its
tokens encode and, at points along the reply (every `point_tokens` tokens
and at its end), the text length there plus, for GatedDeltaNet models, a
copy of the untrimmable layers' state. A new prompt whose text starts with
an entry's text up to a point is run as the entry's ids up to that point
followed by the rest of its text tokenised: the model continues from
exactly the tokens it generated.
"""

import copy
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple


# Claude Code puts a per-request nonce line in system[0] and a changing
# `<total_tokens>` marker in reminders; either one at the front of the prompt
# would defeat prefix reuse. Neither carries meaning for a local model, so we
# remove both from the text before it is templated and tokenised.
_BILLING = re.compile(r"^[ \t]*x-anthropic-billing-header:[^\n]*(\n|$)", re.MULTILINE)
_TOTAL_TOKENS = re.compile(r"<total_tokens>.*?</total_tokens>\n?", re.DOTALL)


def normalize_text(text: str) -> str:
    """Drop the Claude Code billing-header line and `<total_tokens>…</total_tokens>`."""
    return _TOTAL_TOKENS.sub("", _BILLING.sub("", text))


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
class Point:
    """A place along an entry where it can be cut: `n` tokens, `text_len` chars."""

    n: int
    text_len: int
    # Copies of the untrimmable layers' caches at `n` (None: trimming suffices,
    # or `n` is the entry's end).
    states: Optional[List[Any]] = None


@dataclass
class Entry:
    tokens: Tuple[int, ...]
    cache: List[Any]
    drafter_state: dict
    nbytes: int
    trimmable: bool
    key: Optional[str] = None
    text: str = ""  # what `tokens` encode, when known (chat requests)
    points: List[Point] = field(default_factory=list)

    def cut_points(self) -> List[int]:
        """Token counts this entry can be cut back to (all, if trimmable)."""
        return [len(self.tokens)] + [p.n for p in self.points if p.states is not None]


@dataclass
class Hit:
    """What `fetch` found: a cache holding `prompt[:n]` for the caller to extend."""

    cache: List[Any]
    drafter_state: dict
    n: int
    trim: int  # tokens the caller trims off the drafter
    prompt: List[int]  # the prompt to run: the request's, or the entry's ids + rest


class PromptCache:
    """LRU store of (tokens -> target cache + drafter state) within `max_bytes`.

    `point_tokens`: reply tokens between the cut points of a chat reply.
    """

    def __init__(self, max_bytes: int, *, point_tokens: int = 256):
        self.max_bytes = max_bytes
        self.point_tokens = point_tokens
        self._entries: "OrderedDict[int, Entry]" = OrderedDict()
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self):
        return len(self._entries)

    def fetch(
        self,
        prompt: Sequence[int],
        key: Optional[str] = None,
        *,
        text: Optional[str] = None,
        encode: Optional[Callable[[str], List[int]]] = None,
    ) -> Optional[Hit]:
        """The longest reusable prefix of `prompt` (or of its `text`), for the caller to own.

        Token match: an entry whose ids start `prompt`, cut back to the
        common prefix (trimmable) or to a cut point. Text match (`text` and
        `encode` given): an entry whose text starts `text` up to one of its
        points; the prompt becomes the entry's ids to there + `encode(rest)`.
        The longer reuse wins; at least the last prompt row is left to run
        (its logits start the answer). An entry the request reuses (nearly)
        whole is taken out: the caller extends it and inserts it back, as in
        an agent's next turn. One that would lose more than a tenth is
        copied, so a conversation that shares only a prefix with it (a
        template header, a system prompt) doesn't destroy it. None when
        nothing helps. Only entries stored under `key` are considered.
        """
        best, best_n, best_prompt = None, 0, list(prompt)
        for i, e in self._entries.items():
            if e.key != key:
                continue
            c = min(_common_prefix(e.tokens, prompt), len(prompt) - 1)
            n = c if e.trimmable else max([k for k in e.cut_points() if k <= c] or [0])
            if n > best_n:
                best, best_n, best_prompt = i, n, list(prompt)
            if text is None or encode is None or not e.text:
                continue
            for p in e.points:
                if p.n <= best_n or not text.startswith(e.text[: p.text_len]):
                    continue
                spliced = list(e.tokens[: p.n]) + encode(text[p.text_len :])
                if len(spliced) > p.n:
                    best, best_n, best_prompt = i, p.n, spliced
        if best is None:
            return None
        entry = self._entries[best]
        trim = len(entry.tokens) - best_n
        if trim * 10 > len(entry.tokens):
            self._entries.move_to_end(best)
            entry = copy.deepcopy(entry)
        else:
            del self._entries[best]
        return Hit(_cut(entry, best_n), entry.drafter_state, best_n, trim, best_prompt)

    def insert(
        self,
        tokens: Sequence[int],
        cache: List[Any],
        drafter_state: dict,
        key: Optional[str] = None,
        *,
        text: str = "",
        points: Sequence[Point] = (),
    ):
        """Store an entry (owned by the store from now on) and evict to the budget."""
        trimmable = all(c.is_trimmable() for c in cache)
        points = list(points)
        nbytes = _nbytes(cache) + _nbytes(drafter_state) + _nbytes([p.states for p in points])
        tokens = tuple(tokens)
        same = [i for i, e in self._entries.items() if e.tokens == tokens and e.key == key]
        for i in same:
            del self._entries[i]
        if nbytes > self.max_bytes or not tokens:
            return
        while self._entries and self.nbytes + nbytes > self.max_bytes:
            self._entries.popitem(last=False)
        self._entries[self._next] = Entry(
            tokens, cache, drafter_state, nbytes, trimmable, key, text, points
        )
        self._next += 1

    def clear(self):
        self._entries.clear()

    # ---- what the engine keeps around a generation -------------------------------

    def restore(
        self,
        prompt: Sequence[int],
        drafter,
        key: Optional[str] = None,
        *,
        text: Optional[str] = None,
        encode: Optional[Callable[[str], List[int]]] = None,
    ) -> Optional[Hit]:
        """`fetch`, with `drafter` put in the hit's state (holding `prompt[:hit.n]`)."""
        hit = self.fetch(prompt, key, text=text, encode=encode)
        if hit is not None:
            drafter.load_state(hit.drafter_state)
            if hit.trim:
                drafter.trim(hit.trim)
        return hit

    def keep(
        self,
        tokens: Sequence[int],
        cache: List[Any],
        drafter,
        key: Optional[str] = None,
        *,
        copy_state: bool = False,
        reply: Optional[Tuple[str, List[Point]]] = None,
    ):
        """Store `cache` + the drafter's state (both holding `tokens`) for reuse.

        `copy_state`: store copies (the caller goes on using both).
        `reply`: `PointRecorder.end()` of a finished answer (its text and points).
        """
        if not tokens:
            return
        state = drafter.state()
        if copy_state:
            cache, state = copy.deepcopy(cache), copy.deepcopy(state)
        text, points = reply if reply is not None else ("", [])
        self.insert(tokens, cache, state, key, text=text, points=points)

    def snapshot_at(
        self, cache: List[Any], cached: int, prompt_len: int
    ) -> Optional[int]:
        """How many prompt tokens to run and `snapshot` before the answer, or None.

        An untrimmable (GatedDeltaNet) cache can't be cut back later, so a copy
        at prompt[:-1] serves retries of this prompt and follow-ups whose
        history differs from our raw output.
        """
        trimmable = all(c.is_trimmable() for c in cache)
        return None if trimmable or cached >= prompt_len - 1 else prompt_len - 1

    def snapshot(self, tokens: Sequence[int], cache: List[Any], drafter, key=None):
        """Store copies of `cache` and the drafter (at `snapshot_at`'s length)."""
        self.keep(tokens, cache, drafter, key, copy_state=True)

    def recorder(
        self, cache: List[Any], prompt_len: int, text: Optional[str]
    ) -> Optional["PointRecorder"]:
        """The cut-point recorder of a chat reply (None: no text to reuse it by)."""
        if text is None:
            return None
        return PointRecorder(cache, prompt_len, text, self.point_tokens)

    def keep_finished(
        self,
        tokens: Sequence[int],
        cache: List[Any],
        drafter,
        key: Optional[str] = None,
        *,
        points: Optional["PointRecorder"] = None,
        stopped: bool = False,
    ):
        """Keep a finished generation; `tokens` = prompt + reply[:-1], which the
        cache and drafter hold. `stopped`: it ended with a stop token."""
        reply = None if points is None else points.end(len(tokens), whole=stopped)
        self.keep(tokens, cache, drafter, key, reply=reply)

    def keep_cancelled(
        self, tokens: Sequence[int], cache: List[Any], drafter, key: Optional[str] = None
    ):
        """Keep a cancelled generation's prompt + reply[:-1] (`tokens`): an agent's
        next turn after a cancel (Esc in Claude Code) shares it. Closing the
        decode generator rewound the caches to exactly those tokens."""
        if cache:
            self.keep(tokens, cache, drafter, key)


def _cut(entry: Entry, n: int) -> List[Any]:
    """The entry's cache cut back to `n` tokens (a cut point if untrimmable)."""
    cache, extra = entry.cache, len(entry.tokens) - n
    if extra == 0:
        return cache
    if not entry.trimmable:
        states = next(p.states for p in entry.points if p.n == n and p.states)
        untrimmable = iter(states)
        cache = [c if c.is_trimmable() else next(untrimmable) for c in cache]
    for c in cache:
        if c.is_trimmable():
            c.trim(extra)
    return cache


def settled(detokenizer) -> bool:
    """True when a streaming detokenizer holds nothing back (a partial UTF-8
    character, a space kept for the next token): the text it has given out
    is then exactly the text of the tokens it was fed. Unknown kinds: False."""
    if hasattr(detokenizer, "_unflushed"):  # BPE and SPM (mlx_lm 0.32)
        return not detokenizer._unflushed
    if hasattr(detokenizer, "_current_tokens"):  # naive: flushes at newlines
        return not detokenizer._current_tokens
    return False


class PointRecorder:
    """Collects an entry's cut points while its reply is generated.

    Call `before(j, ...)` before token j of the reply is detokenised and
    `sent(text)` for every piece of text the client is given. A point is
    taken at most every `every` tokens, where the caches hold exactly
    `prompt + reply[:j]` (a cycle's end; the anchor layer's offset says so)
    and the detokenizer has settled; an untrimmable cache's layers are copied
    there. `end()` gives the points, the last one where the caches end.
    """

    def __init__(self, cache: List[Any], prompt_len: int, text: str, every: int):
        self.cache, self.prompt_len, self.text, self.every = cache, prompt_len, text, every
        self.trimmable = all(c.is_trimmable() for c in cache)
        self.points: List[Point] = []
        self.reply: List[str] = []
        self.last: Optional[Point] = None  # where the caches hold reply[:j]
        self._taken = 0

    def before(self, j: int, detokenizer):
        n, here = self.prompt_len + j, len(self.text) + sum(map(len, self.reply))
        self.last = Point(n, here) if settled(detokenizer) else None
        if self.last is None or j - self._taken < self.every:
            return
        # Looked up each time: in a batch the list's entries change (batch.RowCache).
        anchor = next((c for c in self.cache if hasattr(c, "offset")), None)
        if anchor is None or anchor.offset != n:
            return
        if not self.trimmable:
            self.last.states = [copy.deepcopy(c) for c in self.cache if not c.is_trimmable()]
        self.points.append(self.last)
        self._taken = j

    def sent(self, text: str):
        self.reply.append(text)

    def end(self, n: int, *, whole: bool) -> Tuple[str, List[Point]]:
        """The entry's text and points for caches holding `n` tokens.

        `whole`: all text sent belongs to those tokens (the reply ended with
        a stop token); else it ends before the last token's text.
        """
        full = self.text + "".join(self.reply)
        end = Point(n, len(full)) if whole else self.last
        points = [p for p in self.points if p.n < n]
        if end is not None and end.n == n:
            end.states = None  # the entry's own cache
            points.append(end)
        return full, points
