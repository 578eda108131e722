"""What both APIs share: errors, prompt building, and running a job as parts."""

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, List, Optional, Sequence, Union

from starlette.requests import Request

from .engine import Engine, Event, Job
from .output import REASONING, TOOL, parse_tool_calls, parser_for
from .prompt_cache import normalize_text


class APIError(Exception):
    """A 4xx/5xx reply; each API renders it in its own error format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )


def check_model(engine: Engine, model: str, *, aliases: Sequence[str] = ()):
    """The loaded model answers to its name, its aliases, "default" and claude-*."""
    names = {engine.config.model_name, "default", *aliases}
    if model in names or model.startswith("claude-"):
        return
    raise APIError(
        404,
        f"The model {model!r} does not exist; this server serves "
        f"{engine.config.model_name!r}",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def encode_chat(
    engine: Engine,
    messages: List[dict],
    tools: Optional[list],
    template_args: Optional[dict] = None,
) -> List[int]:
    for m in messages:
        if isinstance(m.get("content"), str):
            m["content"] = normalize_text(m["content"])
    args = {**engine.config.chat_template_args, **(template_args or {})}
    try:
        prompt = engine.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, **args
        )
    except Exception as e:  # noqa: BLE001 - templates raise on bad conversations
        raise APIError(
            400, f"chat template rejected the messages: {e}", param="messages"
        )
    return list(prompt)


def check_length(engine: Engine, prompt: Sequence[int], max_tokens: int):
    if not prompt:
        raise APIError(400, "the prompt is empty", param="messages")
    limit = engine.config.max_context
    if limit is not None and len(prompt) + 1 > limit:
        raise APIError(
            400,
            f"the prompt has {len(prompt)} tokens; this model's context "
            f"limit is {limit}",
            param="messages",
            code="context_length_exceeded",
        )


@dataclass
class Part:
    """One piece of the answer: text, reasoning text, or a parsed tool call."""

    kind: str  # "text" | "reasoning" | "tool_call"
    text: str = ""
    call: Optional[dict] = None


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "stop_sequence" | "tool_calls" | "error"
    usage: dict = field(default_factory=dict)
    stop_sequence: Optional[str] = None
    error: Optional[str] = None


async def _next_event(job: Job, request: Optional[Request]) -> Event:
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), timeout=0.5)
        except asyncio.TimeoutError:
            if request is not None and await request.is_disconnected():
                job.cancel()
                raise asyncio.CancelledError("client disconnected")


async def run_job(
    engine: Engine,
    job: Job,
    *,
    stop: Sequence[str] = (),
    tools=None,
    raw: bool = False,
    request: Optional[Request] = None,
) -> AsyncIterator[Union[Part, Finish]]:
    """Follow a submitted `job`; yield `Part`s as they become certain, then one `Finish`.

    The job is cancelled when the consumer stops early (client disconnect) or
    a stop sequence matches.
    """
    tok = engine.tokenizer
    # Raw completions keep think markers as text; chat splits them out.
    parser = parser_for(tok, job.prompt, stop, tools=bool(tools), reasoning=not raw)
    n_texts = n_calls = 0
    final = False
    try:
        while True:
            ev = await _next_event(job, request)
            final = ev.finish_reason is not None
            for kind, text in parser.feed(ev.text, final=final):
                yield Part("reasoning" if kind == REASONING else "text", text)
            for call in parse_tool_calls(tok, parser.tool_calls[n_texts:], tools):
                n_calls += 1
                yield Part("tool_call", call=call)
            n_texts = len(parser.tool_calls)
            if parser.stopped_by is not None and not final:
                job.cancel()  # the rest is not wanted; wait for the final event
            if final:
                break
    finally:
        if not final:
            job.cancel()
    if ev.finish_reason == "error":
        yield Finish("error", ev.usage or {}, error=ev.error)
        return
    if parser.stopped_by is not None:
        reason = "stop_sequence"
    elif ev.finish_reason == "length":
        reason = "length"
    else:
        reason = "tool_calls" if n_calls else "stop"
    yield Finish(reason, ev.usage or {}, stop_sequence=parser.stopped_by)


def engine_info(engine: Engine, usage: dict) -> dict:
    """The body field that says which engine served a request."""
    return {
        "engine": usage.get("engine"),
        "drafter": usage.get("drafter"),
        "block_size": usage.get("block_size"),
        "spec": usage.get("spec"),
        "prefill_seconds": usage.get("prefill_seconds"),
        "generation_tps": usage.get("generation_tps"),
    }


def engine_headers(engine: Engine, job: Job) -> dict:
    drafter = engine.drafter_name if job.engine.startswith("speculative") else "none"
    return {"x-mlx-dflash-engine": job.engine, "x-mlx-dflash-drafter": drafter}
