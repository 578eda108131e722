"""OpenAI Responses API routes: POST /v1/responses (+ streaming), GET/DELETE /v1/responses/{id}.

Stateless by default, as Codex uses it: each turn resends the whole history
as input items. A stored response (`store`, default true) can be continued
with `previous_response_id` from a bounded in-memory LRU. Requests are read in
responses_schema.py; output items and stream events are built in
responses_events.py.
"""

from collections import OrderedDict
from typing import List, Optional, Tuple

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..sampling import SamplingParams
from .common import (
    APIError,
    Finish,
    Part,
    check_model,
    encode_chat,
    engine_headers,
    engine_info,
    event_stream,
    fit_max_tokens,
    off_loop,
    run_job,
    submit,
)
from .engine import Engine
from .job import Job
from .responses_events import LAST_EVENT, STATUS, Output, error_body, response_head, sse
from .responses_schema import (
    ResponsesRequest,
    chat_messages,
    input_items,
    request_tools,
    template_args,
)

# The API documents temperature 1 for requests that name none; the server's
# --default-temperature overrides it.
DEFAULT_TEMPERATURE = 1.0
# Stored responses kept for previous_response_id (least recently used go first).
STORE_SIZE = 256


def make_router(engine: Engine, *, store_size: int = STORE_SIZE) -> APIRouter:
    router = APIRouter()
    # (prompt-cache key, response id) -> {"input", "output", "response"}: a
    # response is only found with the API key that made it.
    store: "OrderedDict[tuple, dict]" = OrderedDict()

    def stored(request: Request, rid: str) -> Optional[dict]:
        key = (getattr(request.state, "cache_key", None), rid)
        if key in store:
            store.move_to_end(key)
        return store.get(key)

    def keep(request: Request, items: List[dict], body: dict):
        key = (getattr(request.state, "cache_key", None), body["id"])
        store[key] = {"input": items, "output": body["output"], "response": body}
        while len(store) > store_size:
            store.popitem(last=False)

    async def count(text: str) -> int:
        if not text:
            return 0
        return await off_loop(engine, lambda: len(engine.tokenizer.encode(text)))

    @router.post("/v1/responses")
    async def create(req: ResponsesRequest, request: Request):
        check_model(engine, req.model)
        fmt = req.text.format.type if req.text and req.text.format else "text"
        if fmt != "text":
            raise APIError(
                400, f"unsupported parameter(s): text.format {fmt!r}", param="text"
            )
        tools, namespaces = request_tools(req)
        items = input_items(req.input)
        if req.previous_response_id:
            prev = stored(request, req.previous_response_id)
            if prev is None:
                raise APIError(
                    400,
                    f"Previous response with id {req.previous_response_id!r} not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            items = prev["input"] + prev["output"] + items
        if not items:
            raise APIError(400, "input is empty", param="input")
        messages = chat_messages(req.instructions, items)
        args = template_args(req)
        prompt = await off_loop(
            engine, lambda: encode_chat(engine, messages, tools, args)
        )
        max_tokens, fit = fit_max_tokens(
            engine, prompt, req.max_output_tokens or engine.config.default_max_tokens
        )
        temp = engine.temperature(req.temperature, DEFAULT_TEMPERATURE)
        job = submit(
            engine,
            Job(
                prompt=prompt,
                max_tokens=max_tokens,
                sampling=SamplingParams(temperature=temp, top_p=req.top_p or 1.0),
            ),
            request,
        )
        headers = {**engine_headers(engine, job), **fit}
        engine.metrics.requests.labels("openai-responses", "accepted").inc()
        parts = run_job(
            engine,
            job,
            tools=tools,
            max_calls=1 if req.parallel_tool_calls is False else None,
            request=request,
        )
        out = Output(response_head(req, tools, temp), namespaces)

        async def finish(fin: Finish) -> Tuple[List[dict], dict]:
            """The events that close the output, and the final response object."""
            status = STATUS.get(fin.reason, "completed")
            events = out.close("completed" if status == "completed" else "incomplete")
            body = out.body(status, fin, await count(out.reasoning_text()))
            body["mlx_dflash"] = engine_info(engine, fin.usage)
            if status != "failed" and req.store is not False:
                keep(request, items, body)
            return events, body

        if req.stream:

            async def stream():
                snapshot = out.body("in_progress")
                yield sse(out.event("response.created", response=snapshot))
                yield sse(out.event("response.in_progress", response=snapshot))
                async for p in parts:
                    if isinstance(p, Part):
                        events = out.feed(p)
                    else:
                        events, body = await finish(p)
                        events.append(
                            out.event(LAST_EVENT[body["status"]], response=body)
                        )
                    for e in events:
                        yield sse(e)

            return event_stream(stream(), headers)

        async for p in parts:
            if isinstance(p, Part):
                out.feed(p)
            else:
                fin = p
        if fin.reason == "error":
            return JSONResponse(
                error_body(fin.error, fin.status), status_code=fin.status
            )
        _, body = await finish(fin)
        return JSONResponse(body, headers=headers)

    @router.get("/v1/responses/{rid}")
    async def retrieve(rid: str, request: Request):
        entry = stored(request, rid)
        if entry is None:
            raise APIError(
                404, f"No response found with id {rid!r}.", param="response_id"
            )
        return entry["response"]

    @router.delete("/v1/responses/{rid}")
    async def delete(rid: str, request: Request):
        if stored(request, rid) is None:
            raise APIError(
                404, f"No response found with id {rid!r}.", param="response_id"
            )
        del store[(getattr(request.state, "cache_key", None), rid)]
        return {"id": rid, "object": "response.deleted", "deleted": True}

    return router
