"""Anthropic-compatible routes: /v1/messages (+ streaming) and count_tokens."""

import json
import uuid
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BeforeValidator, Discriminator, Field, Tag

from ..sampling import SamplingParams
from .common import (
    APIError,
    Finish,
    ANTHROPIC_ERROR_TYPES,
    check_model,
    encode_chat,
    engine_headers,
    engine_info,
    fit_max_tokens,
    off_loop,
    run_job,
    submit,
    thinking_args,
)
from .engine import Engine
from .job import Job
from .schema import Body, Lenient

# The Messages API documents temperature 1 for requests that name none; the
# server's --default-temperature overrides it (0: greedy, the fastest exact path).
DEFAULT_TEMPERATURE = 1.0

_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_calls": "tool_use",
}


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


class _Conversation(Body):
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


class MessagesRequest(_Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: Optional[List[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(None, ge=0, le=1)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    metadata: Optional[Dict[str, Any]] = None
    service_tier: Optional[str] = None
    container: Optional[Any] = None


class CountTokensRequest(_Conversation):
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


def chat_messages(req: _Conversation) -> List[dict]:
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


def _tools(req: _Conversation):
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


def _thinking(req: _Conversation) -> Optional[bool]:
    """Thinking on or off as the request says; None: the template's default.

    Reasoning is returned as `thinking` blocks only when the request enabled
    it; otherwise it is dropped (clients that did not ask may read
    `content[0].text`), never shown as text.
    """
    if req.thinking is None:
        return None
    return req.thinking.get("type") in ("enabled", "adaptive")


def _think_budget(req: _Conversation) -> Optional[int]:
    """`budget_tokens` of enabled thinking: the engine closes reasoning there."""
    budget = (req.thinking or {}).get("budget_tokens")
    ok = _thinking(req) and isinstance(budget, int) and budget >= 0
    return budget if ok else None


def _prompt(engine: Engine, req: _Conversation):
    tools = _tools(req)
    # "adaptive" (Claude Code's default) lets the model decide: it may think.
    template_args = thinking_args(None, _thinking(req))
    prompt = encode_chat(engine, chat_messages(req), tools, template_args)
    return prompt, tools


def _usage(u: dict) -> dict:
    # Anthropic counts cache reads apart: input_tokens is the uncached remainder.
    return {
        "input_tokens": u.get("prompt_tokens", 0) - u.get("cached_tokens", 0),
        "cache_read_input_tokens": u.get("cached_tokens", 0),
        "cache_creation_input_tokens": 0,
        "output_tokens": u.get("completion_tokens", 0),
    }


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _error(message: str, status: int = 500) -> dict:
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def make_router(engine: Engine) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        check_model(engine, req.model)
        prompt, _ = await off_loop(engine, lambda: _prompt(engine, req))
        return {"input_tokens": len(prompt)}

    @router.post("/v1/messages")
    async def messages(req: MessagesRequest, request: Request):
        check_model(engine, req.model)
        prompt, tools = await off_loop(engine, lambda: _prompt(engine, req))
        max_tokens, fit = fit_max_tokens(engine, prompt, req.max_tokens)
        temp = engine.temperature(req.temperature, DEFAULT_TEMPERATURE)
        job = submit(
            engine,
            Job(
                prompt=prompt,
                max_tokens=max_tokens,
                sampling=SamplingParams(
                    temperature=temp, top_p=req.top_p or 1.0, top_k=req.top_k or 0
                ),
                think_budget=_think_budget(req),
            ),
            request,
        )
        engine.metrics.requests.labels("anthropic-messages", "accepted").inc()
        head = {
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "type": "message",
            "role": "assistant",
            "model": req.model,
        }
        single = (req.tool_choice or {}).get("disable_parallel_tool_use") is True
        parts = run_job(
            engine,
            job,
            stop=req.stop_sequences or [],
            tools=tools,
            max_calls=1 if single else None,
            show_reasoning=_thinking(req) is True,
            request=request,
        )
        headers = {**engine_headers(engine, job), **fit}
        if req.stream:
            return StreamingResponse(
                _stream(engine, parts, head, len(prompt)),
                media_type="text/event-stream",
                headers=headers,
            )
        content = []
        async for p in parts:
            if isinstance(p, Finish):
                fin = p
            elif p.kind == "tool_call":
                content.append(_tool_use(p.call))
            else:
                kind, key = (
                    ("thinking", "thinking")
                    if p.kind == "reasoning"
                    else ("text", "text")
                )
                if content and content[-1]["type"] == kind:
                    content[-1][key] += p.text
                else:
                    content.append(
                        {"type": kind, key: p.text}
                        | ({"signature": ""} if kind == "thinking" else {})
                    )
        if fin.reason == "error":
            return JSONResponse(_error(fin.error, fin.status), status_code=fin.status)
        body = {
            **head,
            "content": content,
            "stop_reason": _STOP_REASON[fin.reason],
            "stop_sequence": fin.stop_sequence,
            "usage": _usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=headers)

    return router


def _tool_use(call: dict) -> dict:
    return {
        "type": "tool_use",
        "id": f"toolu_{uuid.uuid4().hex[:24]}",
        "name": call["name"],
        "input": call["arguments"],
    }


async def _stream(engine, parts, head, n_prompt):
    start = {
        **head,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    index, open_kind = -1, None

    def close():
        out = []
        if open_kind == "thinking":
            out.append(
                _event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                )
            )
        if open_kind is not None:
            out.append(
                _event(
                    "content_block_stop", {"type": "content_block_stop", "index": index}
                )
            )
        return out

    async for p in parts:
        if isinstance(p, Finish):
            for e in close():
                yield e
            if p.reason == "error":
                yield _event("error", _error(p.error, p.status))
                return
            yield _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _STOP_REASON[p.reason],
                        "stop_sequence": p.stop_sequence,
                    },
                    "usage": _usage(p.usage),
                    "mlx_dflash": engine_info(engine, p.usage),
                },
            )
            yield _event("message_stop", {"type": "message_stop"})
            return
        kind = {"text": "text", "reasoning": "thinking"}.get(p.kind, "tool_use")
        if kind != open_kind or kind == "tool_use":
            for e in close():
                yield e
            index += 1
            open_kind = kind
            if kind == "tool_use":
                block = _tool_use(p.call)
                args = json.dumps(block["input"], ensure_ascii=False)
                block["input"] = {}
            else:
                block = {"type": kind, kind: ""} | (
                    {"signature": ""} if kind == "thinking" else {}
                )
            yield _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        if kind == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": args}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": p.text}
        else:
            delta = {"type": "text_delta", "text": p.text}
        yield _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": delta},
        )
