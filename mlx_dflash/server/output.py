"""Split generated text into answer, reasoning and tool-call parts; find stop strings.

The model streams text pieces that may cut a marker (`<think>`, `<tool_call>`,
a stop sequence) in half, so a tail that could still grow into a marker is
held back until the next piece decides it.
"""

import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .think import opens_think
from .tools import tool_syntax

NORMAL, REASONING, TOOL = "normal", "reasoning", "tool"


def _partial_tail(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best


@dataclass
class OutputParser:
    """Feed text pieces; get back `(kind, text)` segments and finished tool-call texts.

    Args:
        think: (start, end) markers of reasoning text, or None.
        tool: (start, end) markers of a tool call, or None.
        bare: more (start, end) pairs that open a call and stay in its text
          (Qwen3-Coder's `<function=…>…</function>` without `<tool_call>`).
        stop: stop sequences; they end the answer (only answer text is searched).
        state: NORMAL, or REASONING when the prompt already opened a think block.

    Markup never reaches the answer: a stray closing marker (`</tool_call>`
    after a bare call, `</think>` with no opening one) is dropped, and so is
    the whitespace that only separates markup (after `</think>` or a call, and
    before a call). Tool markup inside reasoning stays reasoning: models draft
    calls while they think, and parsing those would run them twice.
    """

    think: Optional[Tuple[str, str]] = None
    tool: Optional[Tuple[str, str]] = None
    bare: Sequence[Tuple[str, str]] = ()
    stop: Sequence[str] = ()
    state: str = NORMAL
    stopped_by: Optional[str] = None
    tool_calls: List[str] = field(default_factory=list)
    _buf: str = ""
    _tool_text: str = ""
    _end: str = ""  # the marker that closes the open call
    _bare: bool = False  # the open call's markers belong to its text
    # Whitespace that may only separate markup from the answer: the answer's
    # leading whitespace after markup, and (with tools) its trailing whitespace,
    # held until more text comes; dropped if a call follows it to the end.
    _answered: bool = False  # answer text other than whitespace has been emitted
    _after_markup: bool = False
    _ws: str = ""
    _ws_then_call: bool = False

    def _starts(self) -> List[Tuple[str, str]]:
        return ([self.tool] if self.tool else []) + list(self.bare)

    def _markers(self) -> List[str]:
        if self.state == REASONING:
            return [self.think[1]]
        if self.state == TOOL:
            return [self._end]
        out = list(self.stop) + [s for s, _ in self._starts()]
        out += [self.tool[1]] if self.tool else []
        out += list(self.think) if self.think else []
        return out

    def feed(self, text: str, final: bool = False) -> List[Tuple[str, str]]:
        """Returns the segments that are now certain; `final` flushes everything."""
        if self.stopped_by is not None:
            return []
        self._buf += text
        out: List[Tuple[str, str]] = []
        while True:
            markers = self._markers()
            hits = [(self._buf.find(m), -len(m), m) for m in markers if m in self._buf]
            if not hits:
                break
            pos, _, marker = min(hits)
            self._emit(out, self._buf[:pos])
            self._buf = self._buf[pos + len(marker) :]
            if self.state == NORMAL and marker in self.stop:
                self.stopped_by = marker
                self._buf = ""
                self._flush_ws(out)
                return out
            self._switch(marker)
        keep = 0 if final else _partial_tail(self._buf, self._markers())
        self._emit(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        if final:
            self._flush_ws(out)
            if self.state == TOOL and self._tool_text:
                # A tool call cut off by max_tokens: hand it over; the parser decides.
                self.tool_calls.append(self._tool_text)
                self._tool_text = ""
        return out

    def _switch(self, marker: str):
        if self.state == REASONING:
            self.state, self._after_markup = NORMAL, True
        elif self.state == TOOL:
            if self._bare:
                self._tool_text += marker  # a bare call's parser reads its markers
            self.tool_calls.append(self._tool_text)
            self._tool_text = ""
            self.state, self._after_markup = NORMAL, True
        elif self.think and marker == self.think[0]:
            self.state = REASONING
        else:
            for start, end in self._starts():
                if marker == start:
                    self.state, self._end, self._ws_then_call = TOOL, end, True
                    self._bare = (start, end) in self.bare
                    self._tool_text = start if self._bare else ""
                    return
            self._after_markup = True  # a stray closing marker: dropped

    def _flush_ws(self, out):
        ws, self._ws = self._ws, ""
        if ws and self.state == NORMAL and not self._ws_then_call:
            self._add(out, ws)

    def _emit(self, out, text: str):
        if self.state == TOOL:
            self._tool_text += text
            return
        if self.state == NORMAL:
            if self._after_markup and not self._answered:
                text = text.lstrip()
            if self._starts() and text:
                text = self._ws + text
                body = text.rstrip()
                text, self._ws = body, text[len(body) :]
                self._ws_then_call = self._ws_then_call and not body
            self._answered = self._answered or bool(text.strip())
        self._add(out, text)

    def _add(self, out, text: str):
        if not text:
            return
        if out and out[-1][0] == self.state:
            out[-1] = (self.state, out[-1][1] + text)
        else:
            out.append((self.state, text))


def parser_for(
    tokenizer,
    prompt: Sequence[int],
    stop: Sequence[str],
    *,
    tools: bool,
    reasoning: bool = True,
):
    """An OutputParser set up from the tokenizer's think markers and tool syntax."""
    think = None
    state = NORMAL
    if reasoning and tokenizer.has_thinking:
        think = (tokenizer.think_start, tokenizer.think_end)
        state = REASONING if opens_think(tokenizer, prompt) else NORMAL
    syntax = tool_syntax(tokenizer) if tools else None
    return OutputParser(
        think=think,
        tool=(syntax.start, syntax.end) if syntax else None,
        bare=syntax.bare if syntax else (),
        stop=[s for s in stop if s],
        state=state,
    )


def parse_tool_calls(tokenizer, texts: Sequence[str], tools) -> List[dict]:
    """Tool-call texts -> [{"name", "arguments": dict}] with the model's parser.

    The parser is `tool_syntax`'s (mlx_lm's, or `parse_qwen` for the
    `<tool_call>` family and the generic format). A call the parser rejects
    (e.g. cut off by max_tokens), one without a name, or one whose arguments
    are not an object is dropped, as mlx_lm's server drops unparsable ones:
    the caller sees fewer calls, never invented or empty ones. Names are not
    checked against `tools` (the client answers unknown ones).
    """
    syntax = tool_syntax(tokenizer)
    calls = []
    for text in texts if syntax else ():
        try:
            parsed = syntax.parse(text, tools)
        except Exception:  # noqa: BLE001 - parsers raise many kinds on bad text
            continue
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(call, dict):
                continue
            name = call.get("name")
            args = call.get("arguments", call.get("parameters"))
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    args = {"_raw": args}
            args = {} if args is None else args
            if isinstance(name, str) and name.strip() and isinstance(args, dict):
                calls.append({"name": name.strip(), "arguments": args})
    return calls
