"""Anthropic Messages requests: the body, its content blocks, and the chat
messages, tools and thinking switch they become for the chat template.

Blocks are told apart by `type` (unknown kinds parse as `OtherBlock`, and
`chat_messages` decides what to do with them); a malformed request is a 400
naming the field.
"""

from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag

from .common import APIError
from .schema import Body, Lenient


def _as_blocks(content):
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class TextBlock(Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(Lenient):
    type: Literal["tool_use"]
    id: Optional[str] = None
    name: str
    input: Dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Lenient):
    type: Literal["tool_result"]
    tool_use_id: Optional[str] = None
    # A string is one text block.
    content: Annotated[Optional[List["Block"]], BeforeValidator(_as_blocks)] = None
    is_error: Optional[bool] = None


class OtherBlock(Lenient):
    type: str  # thinking, image, ...: chat_messages decides by kind


def _block_kind(block) -> Optional[str]:
    kind = (
        block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    )
    if not isinstance(kind, str):
        return None
    return kind if kind in ("text", "tool_use", "tool_result") else "other"


Block = Annotated[
    Union[
        Annotated[TextBlock, Tag("text")],
        Annotated[ToolUseBlock, Tag("tool_use")],
        Annotated[ToolResultBlock, Tag("tool_result")],
        Annotated[OtherBlock, Tag("other")],
    ],
    Discriminator(
        _block_kind,
        custom_error_type="invalid_block",
        custom_error_message="must be a content block: an object with a string type",
    ),
]
Blocks = Annotated[List[Block], BeforeValidator(_as_blocks)]
ToolResultBlock.model_rebuild()


class InputMessage(Lenient):
    # "system": Claude Code's mid-conversation system turns (see chat_messages).
    role: Literal["user", "assistant", "system"]
    content: Blocks  # a string is one text block


class ToolDef(Lenient):
    name: str
    type: Optional[str] = None
    description: Optional[str] = None
    input_schema: Optional[Dict[str, Any]] = None


class Conversation(Body):
    # Unknown fields are ignored (schema.Lenient); those Claude Code sends are
    # listed for the record (they don't change local decoding).
    model: str
    messages: List[InputMessage] = Field(min_length=1)
    system: Optional[Blocks] = None
    tools: Optional[List[ToolDef]] = None
    tool_choice: Optional[Dict[str, Any]] = None
    thinking: Optional[Dict[str, Any]] = None
    context_management: Optional[Dict[str, Any]] = None
    mcp_servers: Optional[List[Dict[str, Any]]] = None
    output_config: Optional[Dict[str, Any]] = None


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[List[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(None, ge=0, le=1)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    metadata: Optional[Dict[str, Any]] = None
    service_tier: Optional[str] = None
    container: Optional[Any] = None


class CountTokensRequest(Conversation):
    pass


def _block_text(blocks: Optional[List[Block]], where: str) -> str:
    out = []
    for j, b in enumerate(blocks or []):
        if b.type == "text":
            out.append(b.text)
        elif b.type in ("image", "document"):
            raise APIError(
                400,
                f"{where}.{j}: {b.type} content is not supported by this server",
                param=where.split(".")[0],
            )
    return "\n".join(out)


def chat_messages(req: Conversation) -> List[dict]:
    """Anthropic system + messages -> the plain dicts HF chat templates read."""
    out = []
    system = _block_text(req.system, "system")
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        role = m.role
        if role == "system":
            # Claude Code's mid-conversation system turns (beta per-turn-control):
            # most chat templates allow a system message only first, so it joins
            # the user turn, marked the way Claude Code marks its own reminders.
            body = _block_text(m.content, f"messages.{i}.content")
            text = f"<system-reminder>\n{body}\n</system-reminder>"
            if out and out[-1]["role"] == "user":
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
            continue
        texts, calls = [], []
        for j, b in enumerate(m.content):
            kind, where = b.type, f"messages.{i}.content.{j}"
            if kind == "text":
                texts.append(b.text)
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {"name": b.name, "arguments": b.input},
                    }
                )
            elif kind == "tool_result" and role == "user":
                result = _block_text(b.content, f"{where}.content")
                if b.is_error:
                    result = f"Error: {result}"
                out.append(
                    {"role": "tool", "tool_call_id": b.tool_use_id, "content": result}
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue  # templates drop past reasoning; so do we
            elif kind in ("image", "document"):
                raise APIError(
                    400,
                    f"{where}: {kind} content is not supported by this server",
                    param="messages",
                )
            else:
                raise APIError(
                    400,
                    f"{where}: unexpected content block {kind!r} in a {role} message",
                    param="messages",
                )
        if texts or calls or role == "assistant":
            msg = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def request_tools(req: Conversation):
    if not req.tools or (req.tool_choice or {}).get("type") == "none":
        return None
    if (req.tool_choice or {}).get("type") in ("any", "tool"):
        # Forcing a call needs constrained decoding, which we don't do.
        raise APIError(
            400,
            "tool_choice 'any'/'tool' cannot be enforced by this server; use 'auto'",
        )
    out = []
    for i, t in enumerate(req.tools):
        if t.input_schema is None:  # server tools (web_search, ...) run at Anthropic
            raise APIError(
                400,
                f"tools.{i} ({t.name!r}): only client tools with an "
                "input_schema are supported",
                param="tools",
            )
        out.append(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description or "",
                    "parameters": t.input_schema,
                },
            }
        )
    return out


def thinking(req: Conversation) -> Optional[bool]:
    """Thinking on or off as the request says; None: the template's default.

    Reasoning is returned as `thinking` blocks only when the request enabled
    it; otherwise it is dropped (clients that did not ask may read
    `content[0].text`), never shown as text.
    """
    if req.thinking is None:
        return None
    return req.thinking.get("type") in ("enabled", "adaptive")


def think_budget(req: Conversation) -> Optional[int]:
    """`budget_tokens` of enabled thinking: the engine closes reasoning there."""
    budget = (req.thinking or {}).get("budget_tokens")
    ok = thinking(req) and isinstance(budget, int) and budget >= 0
    return budget if ok else None
