"""Split generated text into answer, reasoning and tool-call parts; find stop strings.

The model streams text pieces that may cut a marker (`<think>`, `<tool_call>`,
a stop sequence) in half, so a tail that could still grow into a marker is
held back until the next piece decides it.
"""

import json
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from .tools import tool_markers, tool_parser

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
        stop: stop sequences; they end the answer (only answer text is searched).
        state: NORMAL, or REASONING when the prompt already opened a think block.
    """

    think: Optional[Tuple[str, str]] = None
    tool: Optional[Tuple[str, str]] = None
    stop: Sequence[str] = ()
    state: str = NORMAL
    stopped_by: Optional[str] = None
    tool_calls: List[str] = field(default_factory=list)
    _buf: str = ""
    _tool_text: str = ""

    def _markers(self) -> List[str]:
        if self.state == REASONING:
            return [self.think[1]]
        if self.state == TOOL:
            return [self.tool[1]]
        out = list(self.stop)
        out += [self.think[0]] if self.think else []
        out += [self.tool[0]] if self.tool else []
        return out

    def feed(self, text: str, final: bool = False) -> List[Tuple[str, str]]:
        """Returns the segments that are now certain; `final` flushes everything."""
        if self.stopped_by is not None:
            return []
        self._buf += text
        out: List[Tuple[str, str]] = []
        while True:
            markers = self._markers()
            hits = [(self._buf.find(m), m) for m in markers if m and m in self._buf]
            if not hits:
                break
            pos, marker = min(hits)
            self._emit(out, self._buf[:pos])
            self._buf = self._buf[pos + len(marker) :]
            if self.state == NORMAL and marker in self.stop:
                self.stopped_by = marker
                self._buf = ""
                return out
            self._switch(marker)
        keep = 0 if final else _partial_tail(self._buf, self._markers())
        self._emit(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        if final and self.state == TOOL and self._tool_text:
            # A tool call cut off by max_tokens: hand it over; the parser decides.
            self.tool_calls.append(self._tool_text)
            self._tool_text = ""
        return out

    def _switch(self, marker: str):
        if self.state == NORMAL:
            self.state = REASONING if self.think and marker == self.think[0] else TOOL
        elif self.state == TOOL:
            self.tool_calls.append(self._tool_text)
            self._tool_text = ""
            self.state = NORMAL
        else:
            self.state = NORMAL

    def _emit(self, out, text: str):
        if not text:
            return
        if self.state == TOOL:
            self._tool_text += text
        elif out and out[-1][0] == self.state:
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
    """An OutputParser set up from the tokenizer's think / tool markers."""
    think = None
    state = NORMAL
    if reasoning and tokenizer.has_thinking:
        think = (tokenizer.think_start, tokenizer.think_end)
        # The template may open the think block itself (e.g. Qwen3 `<think>\n`).
        start = tokenizer.rfind_think_start(prompt, start=len(prompt) - 12)
        if start >= 0 and tokenizer.rfind_think_end(prompt, start=start) < 0:
            state = REASONING
    tool = tool_markers(tokenizer) if tools else None
    return OutputParser(
        think=think, tool=tool, stop=[s for s in stop if s], state=state
    )


def parse_tool_calls(tokenizer, texts: Sequence[str], tools) -> List[dict]:
    """Tool-call texts -> [{"name", "arguments": dict}] with the tokenizer's parser.

    The parser is mlx_lm's, or the generic format's JSON parse (server/tools.py)
    when the template ignores tools. A call the parser rejects (e.g. cut off by
    max_tokens) is dropped, as mlx_lm's server does; the caller sees fewer
    calls, never invented ones. Names are not checked against `tools`.
    """
    parse = tool_parser(tokenizer)
    calls = []
    for text in texts:
        try:
            parsed = parse(text, tools)
        except Exception:  # noqa: BLE001 - parsers raise many kinds on bad text
            continue
        for call in parsed if isinstance(parsed, list) else [parsed]:
            if isinstance(call, dict) and "name" in call:
                args = call.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        args = {"_raw": args}
                calls.append({"name": call["name"], "arguments": args})
    return calls
