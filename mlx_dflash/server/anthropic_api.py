"""Anthropic-compatible routes: /v1/messages (+ streaming) and count_tokens."""

import json
import uuid
from typing import Any, Dict, List, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

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
from .engine import Engine, Job

# The Messages API documents temperature 1 for requests that name none; the
# server's --default-temperature overrides it (0: greedy, the fastest exact path).
DEFAULT_TEMPERATURE = 1.0

_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_calls": "tool_use",
}


class _Conversation(BaseModel):
    # The Messages API rejects unknown fields; the optional ones Claude Code
    # sends are listed so they are accepted (they don't change local decoding).
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: List[Dict[str, Any]] = Field(min_length=1)
    system: Union[str, List[Dict[str, Any]], None] = None
    tools: Optional[List[Dict[str, Any]]] = None
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


def _block_text(content) -> str:
    if isinstance(content, str):
        return content
    out = []
    for b in content or []:
        if b.get("type") == "text":
            out.append(b.get("text", ""))
        elif b.get("type") in ("image", "document"):
            raise APIError(400, f"{b['type']} content is not supported by this server")
    return "\n".join(out)


def chat_messages(req: _Conversation) -> List[dict]:
    """Anthropic system + messages -> the plain dicts HF chat templates read."""
    out = []
    if req.system:
        out.append({"role": "system", "content": _block_text(req.system)})
    for i, m in enumerate(req.messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise APIError(400, f"messages.{i}.role: must be 'user' or 'assistant'")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise APIError(400, f"messages.{i}.content: must be a string or a list")
        texts, calls = [], []
        for b in content:
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                texts.append(b.get("text", ""))
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    {
                        "id": b.get("id"),
                        "type": "function",
                        "function": {
                            "name": b.get("name"),
                            "arguments": b.get("input") or {},
                        },
                    }
                )
            elif kind == "tool_result" and role == "user":
                result = _block_text(b.get("content"))
                if b.get("is_error"):
                    result = f"Error: {result}"
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id"),
                        "content": result,
                    }
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue  # templates drop past reasoning; so do we
            elif kind in ("image", "document"):
                raise APIError(
                    400,
                    f"messages.{i}: {kind} content is not supported " "by this server",
                )
            else:
                raise APIError(400, f"messages.{i}: unexpected content block {kind!r}")
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
    for t in req.tools:
        if "input_schema" not in t:  # server tools (web_search, ...) run at Anthropic
            raise APIError(
                400,
                f"tool {t.get('name')!r}: only client tools with an "
                "input_schema are supported",
            )
        out.append(
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t["input_schema"],
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
                temperature=temp,
                top_p=req.top_p or 1.0,
                top_k=req.top_k or 0,
                engine=engine.engine_name(temp),
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
