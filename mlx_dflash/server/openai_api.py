"""OpenAI-compatible routes: /v1/chat/completions and /v1/completions.

Request bodies are in openai_schema.py, log-probability formats in logprobs.py.
"""

import json
import time
import uuid
from functools import partial
from typing import List, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..sampling import SamplingParams
from .common import (
    EFFORT_THINKING,
    APIError,
    Finish,
    check_model,
    encode_chat,
    engine_headers,
    engine_info,
    event_stream,
    fit_max_tokens,
    off_loop,
    run_job,
    submit,
    thinking_args,
)
from .engine import Engine
from .job import Job
from .logprobs import ChatLogprobs, CompletionLogprobs
from .openai_schema import (
    DEFAULT_TEMPERATURE,
    ChatRequest,
    CompletionRequest,
    chat_messages,
    chat_tools,
    check_supported,
)


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


def _error_body(message: str, status: int = 500) -> dict:
    code = {503: "server_shutting_down", 504: "timeout"}.get(status)
    return {
        "error": {"message": message, "type": "server_error", "param": None, "code": code}
    }


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

    def _job(req, prompt, max_tokens, logprobs, request) -> Job:
        temp = engine.temperature(req.temperature, DEFAULT_TEMPERATURE)
        return submit(
            engine,
            Job(
                prompt=prompt,
                max_tokens=max_tokens,
                sampling=SamplingParams(
                    temperature=temp,
                    top_p=req.top_p or 1.0,
                    top_k=req.top_k or 0,
                    min_p=req.min_p or 0.0,
                    seed=req.seed,
                ),
                logprobs=logprobs,
            ),
            request,
        )

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        check_model(engine, req.model)
        check_supported(req)
        tools = chat_tools(req)
        prompt = await off_loop(
            engine,
            lambda: encode_chat(
                engine,
                chat_messages(req.messages),
                tools,
                thinking_args(
                    req.chat_template_kwargs,
                    EFFORT_THINKING.get(req.reasoning_effort),
                ),
            ),
        )
        max_tokens, fit = fit_max_tokens(
            engine,
            prompt,
            req.max_completion_tokens
            or req.max_tokens
            or engine.config.default_max_tokens,
        )
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        job = _job(req, prompt, max_tokens, logprobs, request)
        headers = {**engine_headers(engine, job), **fit}
        engine.metrics.requests.labels("openai-chat", "accepted").inc()
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "created": created, "model": req.model}
        parts = run_job(
            engine,
            job,
            stop=stop,
            tools=tools,
            max_calls=1 if req.parallel_tool_calls is False else None,
            request=request,
        )
        lp = ChatLogprobs(engine.tokenizer) if logprobs is not None else None
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            events = _chat_stream(engine, parts, head, usage_chunk, lp)
            return event_stream(events, headers)
        text, reasoning, calls, tokens = [], [], [], []
        async for p in parts:
            tokens += p.logprobs
            if isinstance(p, Finish):
                fin = p
            elif p.kind == "text":
                text.append(p.text)
            elif p.kind == "reasoning":
                reasoning.append(p.text)
            else:
                calls.append(_tool_call(p.call))
        if fin.reason == "error":
            return JSONResponse(
                _error_body(fin.error, fin.status), status_code=fin.status
            )
        message = {
            "role": "assistant",
            "content": "".join(text) or (None if calls else ""),
        }
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        head = {**head, "object": "chat.completion"}
        body = _reply(engine, head, fin, {"message": message}, lp, tokens)
        return JSONResponse(body, headers=headers)

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(engine, req.model)
        check_supported(req)
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
            text = req.prompt
            prompt = await off_loop(engine, lambda: list(engine.tokenizer.encode(text)))
        else:
            vocab = len(engine.tokenizer)
            if any(not 0 <= t < vocab for t in req.prompt):
                raise APIError(400, "prompt token ids out of range", param="prompt")
            prompt = list(req.prompt)
        max_tokens, fit = fit_max_tokens(engine, prompt, req.max_tokens)
        stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
        job = _job(req, prompt, max_tokens, req.logprobs, request)
        headers = {**engine_headers(engine, job), **fit}
        engine.metrics.requests.labels("openai-completions", "accepted").inc()
        head = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": req.model,
            "object": "text_completion",
        }
        parts = run_job(engine, job, stop=stop, raw=True, request=request)
        lp = CompletionLogprobs(engine.tokenizer) if req.logprobs is not None else None
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            events = _completion_stream(engine, parts, head, usage_chunk, lp)
            return event_stream(events, headers)
        text, tokens = [], []
        async for p in parts:
            tokens += p.logprobs
            if isinstance(p, Finish):
                fin = p
            else:
                text.append(p.text)
        if fin.reason == "error":
            return JSONResponse(
                _error_body(fin.error, fin.status), status_code=fin.status
            )
        body = _reply(engine, head, fin, {"text": "".join(text)}, lp, tokens)
        return JSONResponse(body, headers=headers)

    return router


def _reply(engine, head, fin: Finish, choice: dict, lp, tokens) -> dict:
    """A whole (not streamed) body: one choice, the usage, the engine that served it."""
    choice = {
        "index": 0,
        **choice,
        "logprobs": lp(tokens) if lp else None,
        "finish_reason": _finish_reason(fin),
    }
    return {
        **head,
        "choices": [choice],
        "usage": _usage(fin.usage),
        "mlx_dflash": engine_info(engine, fin.usage),
    }


def _last_chunks(engine, fin: Finish, chunk, head, usage_chunk) -> List[str]:
    """The end of a stream: the error, or the finish chunk (and the usage one)."""
    if fin.reason == "error":
        return [_sse(_error_body(fin.error, fin.status))]
    info = engine_info(engine, fin.usage)
    out = [chunk(_finish_reason(fin), fin.logprobs, mlx_dflash=info)]
    if usage_chunk:
        out.append(_sse({**head, "choices": [], "usage": _usage(fin.usage)}))
    return out


async def _chat_stream(engine, parts, head, usage_chunk, lp):
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta, finish=None, tokens=(), **extra):
        return _sse(
            {
                **head,
                "choices": [
                    {
                        "index": 0,
                        "delta": delta,
                        "logprobs": lp(tokens) if lp and tokens else None,
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
            for c in _last_chunks(engine, p, partial(chunk, {}), head, usage_chunk):
                yield c
            break
        elif p.kind == "text":
            yield chunk({"content": p.text}, tokens=p.logprobs)
        elif p.kind == "reasoning":
            yield chunk({"reasoning_content": p.text}, tokens=p.logprobs)
        else:
            call = _tool_call(p.call, n_calls)
            yield chunk({"tool_calls": [call]}, tokens=p.logprobs)
            n_calls += 1
    yield "data: [DONE]\n\n"


async def _completion_stream(engine, parts, head, usage_chunk, lp):
    def chunk(text, finish=None, tokens=(), **extra):
        choice = {
            "index": 0,
            "text": text,
            "logprobs": lp(tokens) if lp else None,
            "finish_reason": finish,
        }
        return _sse({**head, "choices": [choice], **extra})

    async for p in parts:
        if isinstance(p, Finish):
            for c in _last_chunks(engine, p, partial(chunk, ""), head, usage_chunk):
                yield c
            break
        else:
            yield chunk(p.text, tokens=p.logprobs)
    yield "data: [DONE]\n\n"
