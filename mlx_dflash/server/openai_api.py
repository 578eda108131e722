"""OpenAI-compatible routes: /v1/chat/completions and /v1/completions."""

import json
import time
import uuid
from typing import Any, Dict, List, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .common import (
    APIError,
    Finish,
    Part,
    check_length,
    check_model,
    encode_chat,
    engine_headers,
    engine_info,
    run_job,
)
from .engine import Engine, Job


class _Strict(BaseModel):
    # The OpenAI API rejects unknown parameters; so do we.
    model_config = ConfigDict(extra="forbid")


class _Sampling(_Strict):
    model: str
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    seed: Optional[int] = None
    stream: bool = False
    stream_options: Optional[Dict[str, Any]] = None
    stop: Union[str, List[str], None] = None
    n: int = 1
    user: Optional[str] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None
    logprobs: Optional[Union[bool, int]] = None


class ChatRequest(_Sampling):
    messages: List[Dict[str, Any]] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Union[str, Dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[Dict[str, Any]] = None
    top_logprobs: Optional[int] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None
    store: Optional[bool] = None


class CompletionRequest(_Sampling):
    prompt: Union[str, List[int], List[str]]
    max_tokens: Optional[int] = Field(16, ge=1)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


def _unsupported(req: _Sampling):
    """Parameters we cannot honour are refused, never silently dropped."""
    bad = []
    if req.n != 1:
        bad.append("n")
    if req.logprobs:
        bad.append("logprobs")
    if req.presence_penalty or req.frequency_penalty:
        bad.append("presence_penalty/frequency_penalty")
    if req.logit_bias:
        bad.append("logit_bias")
    if isinstance(req, ChatRequest):
        if req.top_logprobs:
            bad.append("top_logprobs")
        if req.response_format and req.response_format.get("type") != "text":
            bad.append("response_format")
        if req.tool_choice not in (None, "auto", "none"):
            bad.append("tool_choice (only 'auto' and 'none')")
    if isinstance(req, CompletionRequest):
        if req.echo or req.suffix or (req.best_of or 1) != 1:
            bad.append("echo/suffix/best_of")
    if bad:
        raise APIError(400, f"unsupported parameter(s): {', '.join(bad)}", param=bad[0])


def _text(content, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        out = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in ("text", "input_text"):
                raise APIError(
                    400,
                    f"messages[{i}]: only text content parts are " "supported",
                    param="messages",
                )
            out.append(p.get("text", ""))
        return "".join(out)
    raise APIError(
        400,
        f"messages[{i}].content must be a string or a list of parts",
        param="messages",
    )


def chat_messages(messages: List[dict]) -> List[dict]:
    """OpenAI messages -> the plain dicts HF chat templates read."""
    out = []
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(
                400,
                f"messages[{i}].role {role!r} is not one of system, "
                "developer, user, assistant, tool",
                param="messages",
            )
        msg = {
            "role": "system" if role == "developer" else role,
            "content": _text(m.get("content"), i),
        }
        if role == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        calls = m.get("tool_calls") or []
        if calls:
            msg["tool_calls"] = []
            for c in calls:
                fn = dict(c.get("function") or {})
                # Templates expect arguments as a mapping, the API sends JSON text.
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"] or "{}")
                    except ValueError:
                        raise APIError(
                            400,
                            f"messages[{i}]: tool call arguments are " "not valid JSON",
                            param="messages",
                        )
                msg["tool_calls"].append(
                    {"id": c.get("id"), "type": "function", "function": fn}
                )
        out.append(msg)
    return out


def _usage(u: dict) -> dict:
    return {
        "prompt_tokens": u.get("prompt_tokens", 0),
        "completion_tokens": u.get("completion_tokens", 0),
        "total_tokens": u.get("prompt_tokens", 0) + u.get("completion_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": u.get("cached_tokens", 0)},
    }


def _finish_reason(f: Finish) -> str:
    return {"stop_sequence": "stop"}.get(f.reason, f.reason)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _error_body(message: str, type_: str = "server_error") -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def _tool_call(call: dict, index: Optional[int] = None) -> dict:
    out = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": json.dumps(call["arguments"], ensure_ascii=False),
        },
    }
    if index is not None:
        out["index"] = index
    return out


def make_router(engine: Engine) -> APIRouter:
    router = APIRouter()

    def _job(req, prompt, max_tokens) -> Job:
        temp = req.temperature or 0.0
        return engine.submit(
            Job(
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=temp,
                top_p=req.top_p or 1.0,
                top_k=req.top_k or 0,
                seed=req.seed,
                engine=engine.engine_name(temp),
            )
        )

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        check_model(engine, req.model)
        _unsupported(req)
        tools = req.tools if req.tool_choice != "none" else None
        prompt = encode_chat(
            engine, chat_messages(req.messages), tools, req.chat_template_kwargs
        )
        max_tokens = (
            req.max_completion_tokens
            or req.max_tokens
            or engine.config.default_max_tokens
        )
        check_length(engine, prompt, max_tokens)
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        job = _job(req, prompt, max_tokens)
        engine.metrics.requests.labels("openai-chat", "accepted").inc()
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "created": created, "model": req.model}
        parts = run_job(engine, job, stop=stop, tools=tools, request=request)
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                _chat_stream(engine, parts, head, usage_chunk),
                media_type="text/event-stream",
                headers=engine_headers(engine, job),
            )
        text, reasoning, calls = [], [], []
        async for p in parts:
            if isinstance(p, Finish):
                fin = p
            elif p.kind == "text":
                text.append(p.text)
            elif p.kind == "reasoning":
                reasoning.append(p.text)
            else:
                calls.append(_tool_call(p.call))
        if fin.reason == "error":
            return JSONResponse(_error_body(fin.error), status_code=500)
        message = {
            "role": "assistant",
            "content": "".join(text) or (None if calls else ""),
        }
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        body = {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _finish_reason(fin),
                }
            ],
            "usage": _usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=engine_headers(engine, job))

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(engine, req.model)
        _unsupported(req)
        if (
            isinstance(req.prompt, list)
            and req.prompt
            and isinstance(req.prompt[0], str)
        ):
            if len(req.prompt) != 1:
                raise APIError(
                    400, "only one prompt per request is supported", param="prompt"
                )
            req.prompt = req.prompt[0]
        if isinstance(req.prompt, str):
            prompt = list(engine.tokenizer.encode(req.prompt))
        else:
            vocab = len(engine.tokenizer)
            if any(not 0 <= t < vocab for t in req.prompt):
                raise APIError(400, "prompt token ids out of range", param="prompt")
            prompt = list(req.prompt)
        check_length(engine, prompt, req.max_tokens)
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        job = _job(req, prompt, req.max_tokens)
        engine.metrics.requests.labels("openai-completions", "accepted").inc()
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": req.model,
            "object": "text_completion",
        }
        parts = run_job(engine, job, stop=stop, raw=True, request=request)
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                _completion_stream(engine, parts, head, usage_chunk),
                media_type="text/event-stream",
                headers=engine_headers(engine, job),
            )
        text = []
        async for p in parts:
            if isinstance(p, Finish):
                fin = p
            else:
                text.append(p.text)
        if fin.reason == "error":
            return JSONResponse(_error_body(fin.error), status_code=500)
        body = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "text": "".join(text),
                    "logprobs": None,
                    "finish_reason": _finish_reason(fin),
                }
            ],
            "usage": _usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=engine_headers(engine, job))

    return router


async def _chat_stream(engine, parts, head, usage_chunk):
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta, finish=None, **extra):
        return _sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": None,
                        "finish_reason": finish,
                    }
                ],
                **extra,
            }
        )

    yield chunk({"role": "assistant", "content": ""})
    n_calls = 0
    async for p in parts:
        if isinstance(p, Finish):
            if p.reason == "error":
                yield _sse(_error_body(p.error))
                break
            yield chunk({}, _finish_reason(p), mlx_dflash=engine_info(engine, p.usage))
            if usage_chunk:
                yield _sse({**head, "choices": [], "usage": _usage(p.usage)})
        elif p.kind == "text":
            yield chunk({"content": p.text})
        elif p.kind == "reasoning":
            yield chunk({"reasoning_content": p.text})
        else:
            yield chunk({"tool_calls": [_tool_call(p.call, n_calls)]})
            n_calls += 1
    yield "data: [DONE]\n\n"


async def _completion_stream(engine, parts, head, usage_chunk):
    async for p in parts:
        if isinstance(p, Finish):
            if p.reason == "error":
                yield _sse(_error_body(p.error))
                break
            yield _sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "text": "",
                            "logprobs": None,
                            "finish_reason": _finish_reason(p),
                        }
                    ],
                    "mlx_dflash": engine_info(engine, p.usage),
                }
            )
            if usage_chunk:
                yield _sse({**head, "choices": [], "usage": _usage(p.usage)})
        else:
            yield _sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "text": p.text,
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
    yield "data: [DONE]\n\n"
