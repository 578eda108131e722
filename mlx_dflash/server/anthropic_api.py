"""Anthropic-compatible routes: /v1/messages (+ streaming) and count_tokens.

The body and its translation to chat messages are in anthropic_schema.py,
the reply and stream events in anthropic_events.py.
"""

import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..sampling import SamplingParams
from .anthropic_events import STOP_REASON, error_body, stream, tool_use, usage
from .anthropic_schema import (
    Conversation,
    CountTokensRequest,
    MessagesRequest,
    chat_messages,
    request_tools,
    think_budget,
    thinking,
)
from .common import (
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

# The Messages API documents temperature 1 for requests that name none; the
# server's --default-temperature overrides it (0: greedy, the fastest exact path).
DEFAULT_TEMPERATURE = 1.0


def _prompt(engine: Engine, req: Conversation):
    tools = request_tools(req)
    # "adaptive" (Claude Code's default) lets the model decide: it may think.
    template_args = thinking_args(None, thinking(req))
    prompt = encode_chat(engine, chat_messages(req), tools, template_args)
    return prompt, tools


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
                think_budget=think_budget(req),
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
            show_reasoning=thinking(req) is True,
            request=request,
        )
        headers = {**engine_headers(engine, job), **fit}
        if req.stream:
            return event_stream(stream(engine, parts, head, len(prompt)), headers)
        content = []
        async for p in parts:
            if isinstance(p, Finish):
                fin = p
            elif p.kind == "tool_call":
                content.append(tool_use(p.call))
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
            body = error_body(fin.error, fin.status)
            return JSONResponse(body, status_code=fin.status)
        body = {
            **head,
            "content": content,
            "stop_reason": STOP_REASON[fin.reason],
            "stop_sequence": fin.stop_sequence,
            "usage": usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=headers)

    return router
