"""OpenAI Responses API: POST /v1/responses (+ streaming), GET/DELETE /v1/responses/{id}.

Stateless by default, as Codex uses it: each turn resends the whole history
as input items. A stored response (`store`, default true) can be continued
with `previous_response_id` from a bounded in-memory LRU.
"""

import json
import logging
import math
import time
import uuid
from collections import OrderedDict
from types import NoneType
from typing import Any, Dict, List, Optional, Tuple, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, model_validator

from ..sampling import SamplingParams
from .common import (
    APIError,
    Finish,
    Part,
    check_model,
    encode_chat,
    engine_headers,
    engine_info,
    fit_max_tokens,
    off_loop,
    run_job,
    submit,
)
from .engine import Engine, Job
from .schema import Body, Lenient, bad_string

log = logging.getLogger("mlx_dflash.server")

# The API documents temperature 1 for requests that name none; the server's
# --default-temperature overrides it.
DEFAULT_TEMPERATURE = 1.0
# Stored responses kept for previous_response_id (least recently used go first).
STORE_SIZE = 256
ROLES = ("user", "assistant", "system", "developer")


class Reasoning(Lenient):
    effort: Optional[str] = None
    summary: Optional[str] = None


class TextFormat(Lenient):
    type: str = "text"


class TextConfig(Lenient):
    format: Optional[TextFormat] = None


def _finite(value) -> bool:
    """No NaN or infinity anywhere: Python's json reads them, replies can't."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


class ResponsesRequest(Body):
    # Clients send many fields that don't change local decoding (client_metadata,
    # truncation, service_tier, ...): unknown fields are ignored (`Body`).

    model: str
    input: Union[str, List[Dict[str, Any]], None] = None
    instructions: Optional[str] = None
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Union[str, Dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    max_output_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    reasoning: Optional[Reasoning] = None
    text: Optional[TextConfig] = None
    store: Optional[bool] = None
    previous_response_id: Optional[str] = None
    include: Optional[List[str]] = None
    prompt_cache_key: Optional[str] = None
    metadata: Optional[Dict[str, str]] = None  # echoed back, as the API's strings
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_nan(cls, data):
        # Tools and metadata are echoed in the reply, which is strict JSON.
        if not _finite(data):
            raise APIError(400, "NaN and Infinity are not valid JSON numbers")
        return data


# ---- request -> chat messages ---------------------------------------------------


def _tools(req: ResponsesRequest) -> Tuple[Optional[list], Dict[str, str]]:
    """Function tools in chat format, and the namespace of each namespaced one.

    Hosted tools (web_search, file_search, local_shell, custom, mcp...) run at
    OpenAI or need a grammar; they are dropped, not refused, since Codex sends
    web_search with every request.
    """
    if req.tool_choice not in (None, "auto", "none"):
        # Forcing a call needs constrained decoding, which we don't do.
        raise APIError(
            400,
            "unsupported parameter(s): tool_choice (only 'auto' and 'none')",
            param="tool_choice",
        )
    if not req.tools or req.tool_choice == "none":
        return None, {}
    out, namespaces = [], {}

    def add(t, where, namespace=None):
        name, params = t.get("name"), t.get("parameters")
        if not isinstance(name, str) or not name:
            raise APIError(400, f"{where}.name: a function needs a name", param="tools")
        if not isinstance(t.get("description"), (str, NoneType)):
            raise APIError(400, f"{where}.description must be a string", param="tools")
        if not isinstance(params, (dict, NoneType)):
            raise APIError(400, f"{where}.parameters must be an object", param="tools")
        fn = {"name": name, "description": t.get("description") or ""}
        fn["parameters"] = params or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
        if namespace:
            namespaces[name] = namespace

    for i, t in enumerate(req.tools):
        kind, where = t.get("type"), f"tools.{i}"
        if kind == "function":
            add(t, where)
        elif kind == "namespace":
            subs, namespace = t.get("tools") or [], t.get("name")
            if not (isinstance(subs, list) and isinstance(namespace, (str, NoneType))):
                raise APIError(
                    400, f"{where}: a namespace is a name and a list", param="tools"
                )
            for j, sub in enumerate(subs):
                if not isinstance(sub, dict):
                    raise APIError(
                        400, f"{where}.tools.{j} must be an object", param="tools"
                    )
                if sub.get("type") == "function":
                    add(sub, f"{where}.tools.{j}", namespace)
        else:
            log.debug("responses: dropping %r tool (not run by this server)", kind)
    return out or None, namespaces


def _template_args(req: ResponsesRequest) -> Optional[dict]:
    """reasoning.effort -> the template's thinking switch (and gpt-oss's effort)."""
    effort = req.reasoning.effort if req.reasoning else None
    if effort is None:
        return None
    return {
        "enable_thinking": effort not in ("none", "minimal"),
        "reasoning_effort": {"none": "low", "minimal": "low", "xhigh": "high"}.get(
            effort, effort
        ),
    }


def _items(input_) -> List[dict]:
    if input_ is None:
        return []
    if isinstance(input_, str):
        return [{"type": "message", "role": "user", "content": input_}]
    return list(input_)


def _string(item: dict, key: str, where: str) -> Optional[str]:
    value = item.get(key)
    if not isinstance(value, (str, NoneType)):
        raise APIError(400, f"{where}.{key} must be a string", param="input")
    return value


def _text(content, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(
            400, f"{where}.content must be a string or a list", param="input"
        )
    out = []
    for p in content:
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal"):
            key = "refusal" if kind == "refusal" else "text"
            out.append(_string(p, key, where) or "")
        else:
            raise APIError(
                400,
                f"{where}: content part {kind!r} is not supported by this server "
                "(text only)",
                param="input",
            )
    return "\n".join(out)


def _arguments(text, where: str):
    # Templates expect arguments as a mapping, the API sends JSON text.
    if text is None or isinstance(text, dict):
        args = text or {}
    elif not isinstance(text, str):
        raise APIError(400, f"{where}.arguments must be a JSON string", param="input")
    else:
        try:
            args = json.loads(text or "{}")
        except ValueError:
            raise APIError(400, f"{where}.arguments is not valid JSON", param="input")
    if not isinstance(args, dict):
        raise APIError(400, f"{where}.arguments must be a JSON object", param="input")
    if bad_string(args) or not _finite(args):  # json.loads reads "\ud800", NaN
        raise APIError(
            400, f"{where}.arguments holds a value that is not valid", param="input"
        )
    return args


def chat_messages(instructions: Optional[str], items: List[dict]) -> List[dict]:
    """Instructions + input items -> the plain dicts HF chat templates read.

    The leading system/developer messages (and `instructions`) become one system
    message, since many templates accept a single one, first. Function calls
    join the assistant message before them; reasoning items are dropped, as
    templates drop past reasoning.
    """
    out: List[dict] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(
                    400,
                    f"{where}.role {role!r} is not one of {', '.join(ROLES)}",
                    param="input",
                )
            role = "system" if role == "developer" else role
            text = _text(item.get("content"), where)
            if role == "system" and out and all(m["role"] == "system" for m in out):
                out[-1]["content"] += "\n\n" + text
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            if not _string(item, "name", where):
                raise APIError(400, f"{where}.name: a call needs a name", param="input")
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": item["name"],
                    "arguments": _arguments(item.get("arguments"), where),
                },
            }
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _text(output, where),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise APIError(
                400,
                f"{where}: item type {kind!r} is not supported by this server",
                param="input",
            )
    return out


# ---- output items and stream events -------------------------------------------


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class _Output:
    """Turns `Part`s into output items, and the stream events that build them."""

    def __init__(self, head: dict, namespaces: Dict[str, str]):
        self.head, self.namespaces = head, namespaces
        self.items: List[dict] = []
        self.open: Optional[dict] = None  # the message or reasoning item being written
        self.texts: List[str] = []
        self.seq = 0

    def body(self, status: str, fin: Optional[Finish] = None, reasoning: int = 0):
        """The response object: a snapshot while in progress, else the final one."""
        body = {**self.head, "status": status, "output": list(self.items)}
        body.update(error=None, incomplete_details=None, usage=None)
        if fin is not None:
            if status == "failed":
                body["error"] = {"code": "server_error", "message": fin.error or ""}
            if status == "incomplete":
                body["incomplete_details"] = {"reason": "max_output_tokens"}
            body["usage"] = _usage(fin.usage, reasoning)
        return body

    def reasoning_text(self) -> str:
        return "".join(
            c["text"]
            for item in self.items
            if item["type"] == "reasoning"
            for c in item["content"]
        )

    def event(self, type_: str, **fields) -> dict:
        self.seq += 1
        return {"type": type_, "sequence_number": self.seq - 1, **fields}

    def feed(self, p: Part) -> List[dict]:
        if p.kind == "tool_call":
            return self.close() + self._call(p.call)
        kind = "message" if p.kind == "text" else "reasoning"
        events = []
        if self.open is None or self.open["type"] != kind:
            events = self.close() + self._start(kind)
        self.texts.append(p.text)
        name = "output_text" if kind == "message" else "reasoning_text"
        extra = {"logprobs": []} if kind == "message" else {}
        return events + [
            self.event(f"response.{name}.delta", **self._at(), delta=p.text, **extra)
        ]

    def _at(self) -> dict:
        return {
            "item_id": self.open["id"],
            "output_index": len(self.items),
            "content_index": 0,
        }

    def _start(self, kind: str) -> List[dict]:
        if kind == "message":
            self.open = {"id": _id("msg"), "type": "message", "role": "assistant"}
            self.open.update(status="in_progress", content=[])
            part = {"type": "output_text", "text": "", "annotations": []}
        else:
            self.open = {"id": _id("rs"), "type": "reasoning", "summary": []}
            self.open.update(status="in_progress", content=[])
            part = {"type": "reasoning_text", "text": ""}
        self.texts = []
        added = self.event(
            "response.output_item.added",
            output_index=len(self.items),
            item=dict(self.open),
        )
        at = self._at()
        return [added, self.event("response.content_part.added", **at, part=part)]

    def close(self, status: str = "completed") -> List[dict]:
        """Finish the open message or reasoning item, if any."""
        if self.open is None:
            return []
        item, text, at = self.open, "".join(self.texts), self._at()
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            done = self.event("response.output_text.done", **at, text=text, logprobs=[])
        else:
            part = {"type": "reasoning_text", "text": text}
            done = self.event("response.reasoning_text.done", **at, text=text)
        item.update(status=status, content=[part])
        events = [done, self.event("response.content_part.done", **at, part=part)]
        events.append(self._done(item))
        self.open = None
        return events

    def _done(self, item: dict) -> dict:
        event = self.event(
            "response.output_item.done", output_index=len(self.items), item=item
        )
        self.items.append(item)
        return event

    def _call(self, call: dict) -> List[dict]:
        item = {
            "id": _id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": f"call_{uuid.uuid4().hex[:24]}",
            "name": call["name"],
            "arguments": "",
        }
        if call["name"] in self.namespaces:
            item["namespace"] = self.namespaces[call["name"]]
        args = json.dumps(call["arguments"], ensure_ascii=False)
        at = {"item_id": item["id"], "output_index": len(self.items)}
        events = [
            self.event(
                "response.output_item.added",
                output_index=len(self.items),
                item=dict(item),
            )
        ]
        events.append(
            self.event("response.function_call_arguments.delta", **at, delta=args)
        )
        events.append(
            self.event("response.function_call_arguments.done", **at, arguments=args)
        )
        item.update(status="completed", arguments=args)
        return events + [self._done(item)]


def _head(req: ResponsesRequest, tools: Optional[list], temperature: float) -> dict:
    """The response object's fields that echo the request."""
    reasoning = req.reasoning or Reasoning()
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": req.model,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary},
        "store": req.store is not False,
        "temperature": temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": req.tool_choice or "auto",
        "tools": [{"type": "function", **t["function"]} for t in tools or []],
        "top_p": req.top_p or 1.0,
        "truncation": "disabled",
        "metadata": req.metadata or {},
    }


# Finish reason -> response status, and each status's last stream event.
_STATUS = {"error": "failed", "length": "incomplete"}
_LAST_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


def _usage(u: dict, reasoning_tokens: int) -> dict:
    prompt, out = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": u.get("cached_tokens", 0),
            "cache_write_tokens": 0,
        },
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, out)},
        "total_tokens": prompt + out,
    }


def _error_body(message: str, status: int = 500) -> dict:
    code = {503: "server_shutting_down", 504: "timeout"}.get(status)
    return {
        "error": {
            "message": message,
            "type": "server_error",
            "param": None,
            "code": code,
        }
    }


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


# ---- routes -------------------------------------------------------------------------


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
        tools, namespaces = _tools(req)
        items = _items(req.input)
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
        args = _template_args(req)
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
        out = _Output(_head(req, tools, temp), namespaces)

        async def finish(fin: Finish) -> Tuple[List[dict], dict]:
            """The events that close the output, and the final response object."""
            status = _STATUS.get(fin.reason, "completed")
            events = out.close("completed" if status == "completed" else "incomplete")
            body = out.body(status, fin, await count(out.reasoning_text()))
            body["mlx_dflash"] = engine_info(engine, fin.usage)
            if status != "failed" and req.store is not False:
                keep(request, items, body)
            return events, body

        if req.stream:

            async def stream():
                snapshot = out.body("in_progress")
                yield _sse(out.event("response.created", response=snapshot))
                yield _sse(out.event("response.in_progress", response=snapshot))
                async for p in parts:
                    if isinstance(p, Part):
                        events = out.feed(p)
                    else:
                        events, body = await finish(p)
                        events.append(
                            out.event(_LAST_EVENT[body["status"]], response=body)
                        )
                    for e in events:
                        yield _sse(e)

            return StreamingResponse(
                stream(), media_type="text/event-stream", headers=headers
            )

        async for p in parts:
            if isinstance(p, Part):
                out.feed(p)
            else:
                fin = p
        if fin.reason == "error":
            return JSONResponse(
                _error_body(fin.error, fin.status), status_code=fin.status
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
