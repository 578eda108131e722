"""Tool-call syntax: which markers and parser a model's calls need (`tool_syntax`).

A template that renders tools keeps the native path (the tokenizer's markers
and mlx_lm tool parser; the Qwen family reads both its XML and JSON forms).
For one that does not (SmolLM2's chatml, say), the tools would vanish from
the prompt without a word; instead we write them into the system message
with `GENERIC_TOOL_PROMPT`, render past calls and results as tagged text the
template can show, and parse `<tool_call>` JSON back out.
"""

import json
import re
import weakref
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from mlx_lm.tool_parsers import json_tools, qwen3_coder

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_START, TOOL_RESPONSE_END = "<tool_response>", "</tool_response>"
# Qwen3-Coder / Qwen3.5 write `<function=NAME>` blocks, sometimes without `<tool_call>`.
FUNCTION = ("<function=", "</function>")
_FUNCTION_BLOCK = re.compile(r"<function=.*?</function>", re.DOTALL)

# `{tools}` becomes one JSON object per line: {"name", "description", "parameters"}.
GENERIC_TOOL_PROMPT = """# Tools

You can call the tools below to help with the user's request. Each line is one \
tool as JSON: its name, description and parameters (a JSON Schema).

{tools}

To call a tool, reply with a JSON object holding its name and arguments inside \
<tool_call></tool_call> tags:
<tool_call>{"name": "tool_name", "arguments": {"param": "value"}}</tool_call>
Put one call in each pair of tags; to call several tools, write several pairs. \
The results come back in a user message, each inside \
<tool_response></tool_response> tags."""

# A name no template would print unless it renders the tools it is given.
_PROBE = "mlx_dflash_probe_tool_4f1c9e"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE,
        "description": "Probe.",
        "parameters": {"type": "object", "properties": {}},
    },
}
_formats: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tool_format(tokenizer) -> str:
    """"native" when the chat template renders `tools`, else "generic"; cached."""
    fmt = _formats.get(tokenizer)
    if fmt is None:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "Hi"}],
                tools=[_PROBE_TOOL],
                add_generation_prompt=True,
                tokenize=False,
            )
            fmt = "native" if _PROBE in text else "generic"
        except Exception:  # noqa: BLE001 - a template that fails on tools ignores them
            fmt = "generic"
        _formats[tokenizer] = fmt
    return fmt


@dataclass(frozen=True)
class ToolSyntax:
    """How the model writes a tool call, and the `parse(text, tools)` for its text.

    `start`/`end` enclose a call and are cut off; each `bare` (start, end) pair
    also opens one but stays in the text given to `parse` (Qwen3-Coder's
    `<function=…>…</function>` written without `<tool_call>`).
    """

    start: str
    end: str
    parse: Callable
    bare: Tuple[Tuple[str, str], ...] = ()


def tool_syntax(tokenizer) -> Optional[ToolSyntax]:
    """The one place that picks markers and parser; None if the model has none.

    The Qwen family (`<tool_call>`: mlx_lm's json_tools and qwen3_coder, and our
    generic format) gets `parse_qwen`, which reads either form of the call.
    """
    if tool_format(tokenizer) == "generic":
        return ToolSyntax(TOOL_CALL_START, TOOL_CALL_END, parse_qwen)
    parser = tokenizer.tool_parser if tokenizer.has_tool_calling else None
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    if parser is qwen3_coder.parse_tool_call or (
        parser is None and "<function=" in template
    ):
        return ToolSyntax(TOOL_CALL_START, TOOL_CALL_END, parse_qwen, (FUNCTION,))
    if parser is json_tools.parse_tool_call or (
        parser is None and TOOL_CALL_START in template
    ):
        return ToolSyntax(TOOL_CALL_START, TOOL_CALL_END, parse_qwen)
    if parser is None:
        return None
    return ToolSyntax(tokenizer.tool_call_start, tokenizer.tool_call_end, parser)


def parse_qwen(text: str, tools=None) -> List[dict]:
    """A `<tool_call>` body: XML `<function=…>` blocks, else JSON object(s).

    Each XML block goes to mlx_lm's qwen3_coder parser (values converted by the
    tool's schema types); a block it rejects is dropped, the others are kept.
    """
    blocks = _FUNCTION_BLOCK.findall(text)
    if blocks:
        calls = []
        for block in blocks:
            try:
                calls.append(qwen3_coder.parse_tool_call(block, tools))
            except (ValueError, TypeError, SyntaxError):
                continue
        return calls
    calls, text, i = [], text.strip(), 0
    decoder = json.JSONDecoder()
    while i < len(text):  # several objects in one pair of tags are several calls
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            if not calls:
                raise
            break  # trailing junk after whole calls
        calls += value if isinstance(value, list) else [value]
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
    return calls


def _call_text(call: dict) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass  # shown as the text it was
    body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_START}{body}{TOOL_CALL_END}"


def tools_section(tools: list) -> str:
    lines = []
    for t in tools:
        fn = t.get("function", t)
        spec = {
            "name": fn.get("name"),
            "description": fn.get("description", ""),
            "parameters": fn.get("parameters", {}),
        }
        lines.append(json.dumps(spec, ensure_ascii=False))
    return GENERIC_TOOL_PROMPT.replace("{tools}", "\n".join(lines))


def generic_messages(messages: List[dict], tools: Optional[list]) -> List[dict]:
    """HF-style messages (+ OpenAI-style `tools`) -> messages any template can render.

    Tools go into the system message (appended, or a new first one); an
    assistant's `tool_calls` are appended to its content as tagged JSON; `tool`
    results become user messages in `<tool_response>` tags, one user message
    per run of results (plus the user text right after them), since templates
    without tools often know no `tool` role and some insist roles alternate.
    A conversation with no tools, calls or results comes back unchanged.
    """
    out: List[dict] = []
    merge = False  # the last message holds tool results: a user turn joins it
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            text = m.get("content") or ""
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = f"{text}\n{calls}" if text else calls
        elif role == "tool":
            text = m.get("content") or ""
            m = {
                "role": "user",
                "content": f"{TOOL_RESPONSE_START}\n{text}\n{TOOL_RESPONSE_END}",
            }
        if merge and m.get("role") == "user":
            out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + m["content"]}
        else:
            out.append(m)
        merge = role == "tool" or (merge and role == "user")
    if tools:
        section = tools_section(tools)
        if out and out[0].get("role") == "system":
            text = out[0].get("content") or ""
            out[0] = {**out[0], "content": f"{text}\n\n{section}" if text else section}
        else:
            out.insert(0, {"role": "system", "content": section})
    return out
