"""What both APIs share: errors, prompt building, and running a job as parts."""

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, List, Optional, Sequence, Tuple, TypeVar, Union

from fastapi.responses import StreamingResponse
from starlette.requests import Request

from .engine import Engine, ShuttingDown
from .job import Job, TokenLogprob
from .output import REASONING, parse_tool_calls, parser_for
from .prompt_cache import normalize_text
from .tools import generic_messages, tool_format


# Anthropic's error `type` for each HTTP status (OpenAI's is in the body's `type`).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


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


# What a request may pass to the chat template: scalar switches that templates
# read. Not a template of its own, nor apply_chat_template's options (tokenize,
# return_dict, ...); the operator's --chat-template-args is not limited.
TEMPLATE_SWITCHES = (
    "enable_thinking",
    "thinking",
    "reasoning_effort",
    "preserve_thinking",
)


def check_template_args(args: Optional[dict], *, param: str) -> Optional[dict]:
    """Refuse (400, naming the key) what is not a `TEMPLATE_SWITCHES` scalar."""
    for k, v in (args or {}).items():
        if k not in TEMPLATE_SWITCHES:
            raise APIError(
                400,
                f"{param}.{k}: not a template switch a request may set "
                f"(those are {', '.join(TEMPLATE_SWITCHES)})",
                param=param,
            )
        if v is not None and not isinstance(v, (bool, str, int, float)):
            raise APIError(
                400,
                f"{param}.{k}: must be a boolean, string, number or null",
                param=param,
            )
    return args


class ChatPrompt(list):
    """A rendered chat's token ids, with the `text` they encode: the prompt
    cache aligns a new turn with the previous reply by text."""

    def __init__(self, ids, text: str):
        super().__init__(ids)
        self.text = text


def encode_chat(
    engine: Engine,
    messages: List[dict],
    tools: Optional[list],
    template_args: Optional[dict] = None,
) -> ChatPrompt:
    for m in messages:
        if isinstance(m.get("content"), str):
            m["content"] = normalize_text(m["content"])
    if tool_format(engine.tokenizer) == "generic":
        # The template would drop the tools (and past calls): render them as text.
        messages, tools = generic_messages(messages, tools), None
    args = {**engine.config.chat_template_args, **(template_args or {})}
    try:
        text = engine.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=False,
            **args,
        )
    except Exception as e:  # noqa: BLE001 - templates raise on bad conversations
        raise APIError(
            400, f"chat template rejected the messages: {e}", param="messages"
        )
    # As apply_chat_template tokenises: the template writes any BOS itself.
    return ChatPrompt(engine.tokenizer.encode(text, add_special_tokens=False), text)


# OpenAI `reasoning_effort` -> the template's thinking switch ("none"/"minimal": off).
EFFORT_THINKING = {
    "none": False,
    "minimal": False,
    "low": True,
    "medium": True,
    "high": True,
}


def thinking_args(
    template_args: Optional[dict], thinking: Optional[bool]
) -> Optional[dict]:
    """Chat-template kwargs with the request's thinking switch (None: the template's).

    `enable_thinking` given in the kwargs themselves wins; mlx_lm's tokenizer
    renames it for templates whose switch is called `thinking`.
    """
    if thinking is None:
        return template_args
    return {"enable_thinking": thinking, **(template_args or {})}


T = TypeVar("T")


async def off_loop(engine: Engine, fn: Callable[[], T]) -> T:
    """Run `fn` (templating, tokenising) on the engine's text thread.

    A 1 MiB prompt takes seconds to template and tokenise; on the event loop
    it would stall /health and every open stream meanwhile.
    """
    return await asyncio.get_running_loop().run_in_executor(engine.text_pool, fn)


def fit_max_tokens(
    engine: Engine, prompt: Sequence[int], max_tokens: int
) -> Tuple[int, dict]:
    """`max_tokens` lowered to what the context window leaves, and the headers.

    A prompt that leaves no room is a 400; one that leaves less than asked
    lowers `max_tokens` (the answer then ends with finish reason `length`)
    and says so in the `x-mlx-dflash-max-tokens` header. The memory guard
    checks what remains.
    """
    if not prompt:
        raise APIError(400, "the prompt is empty", param="messages")
    limit = engine.config.max_context
    headers = {}
    if limit is not None:
        room = limit - len(prompt)
        if room < 1:
            raise APIError(
                400,
                f"the prompt has {len(prompt)} tokens; this model's context "
                f"limit is {limit}",
                param="messages",
                code="context_length_exceeded",
            )
        if max_tokens > room:
            max_tokens = room
            headers["x-mlx-dflash-max-tokens"] = str(room)
    try:
        engine.check_memory(len(prompt), max_tokens)
    except ValueError as e:
        raise APIError(400, str(e), param="max_tokens", code="insufficient_memory")
    return max_tokens, headers


def submit(engine: Engine, job: Job, request: Optional[Request]) -> Job:
    """Queue `job` under the client's prompt-cache key; 503 while shutting down."""
    if request is not None:
        job.cache_key = getattr(request.state, "cache_key", None)
    job.text = getattr(job.prompt, "text", None)
    try:
        return engine.submit(job)
    except ShuttingDown as e:
        raise APIError(503, str(e), type="server_error", code="server_shutting_down")


@dataclass
class Part:
    """One piece of the answer: text, reasoning text, or a parsed tool call."""

    kind: str  # "text" | "reasoning" | "tool_call"
    text: str = ""
    call: Optional[dict] = None
    # Tokens decoded since the previous part (when the job asked for logprobs).
    logprobs: List[TokenLogprob] = field(default_factory=list)


@dataclass
class Finish:
    reason: str  # "stop" | "length" | "stop_sequence" | "tool_calls" | "error"
    usage: dict = field(default_factory=dict)
    stop_sequence: Optional[str] = None
    error: Optional[str] = None
    status: int = 500  # HTTP status of an error
    logprobs: List[TokenLogprob] = field(default_factory=list)  # not yet sent


async def _watch(job: Job, request: Request):
    """Cancel `job` once its client has gone, whether or not anyone still reads it.

    A response's body generator that is abandoned mid-`yield` is only closed
    when it is garbage-collected, so its `finally` can't be the one signal.
    The body has been read, so the next message is the disconnect (or the
    end of the response).
    """
    while not job.finished.is_set():
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel("client")
            return


async def run_job(
    engine: Engine,
    job: Job,
    *,
    stop: Sequence[str] = (),
    tools=None,
    max_calls: Optional[int] = None,
    raw: bool = False,
    show_reasoning: bool = True,
    request: Optional[Request] = None,
) -> AsyncIterator[Union[Part, Finish]]:
    """Follow a submitted `job`; yield `Part`s as they become certain, then one `Finish`.

    The job is cancelled when the consumer stops early (client disconnect), a
    stop sequence matches, or `max_calls` tool calls have been made (parallel
    tool calls turned off: the answer ends after the first call). Reasoning
    is split out of the answer unless `raw`; `show_reasoning=False` drops it
    (its tokens still count in the usage), it never becomes text.
    """
    tok = engine.tokenizer
    # Raw completions keep think markers as text; chat splits them out.
    parser = parser_for(tok, job.prompt, stop, tools=bool(tools), reasoning=not raw)
    n_texts = n_calls = 0
    final = False
    # Log-probabilities ride on the next part out; once a stop sequence has
    # matched, later tokens are not part of the answer and are dropped.
    pending: List[TokenLogprob] = []

    def part(kind, text="", call=None):
        nonlocal pending
        p, pending = Part(kind, text, call, pending), []
        return p

    if request is not None:
        job.watcher = asyncio.get_running_loop().create_task(_watch(job, request))
    try:
        while True:
            ev = await job.next_event()
            final = ev.finish_reason is not None
            if parser.stopped_by is None:
                pending += ev.logprobs
            for kind, text in parser.feed(ev.text, final=final):
                if kind != REASONING:
                    yield part("text", text)
                elif show_reasoning:
                    yield part("reasoning", text)
            for call in parse_tool_calls(tok, parser.tool_calls[n_texts:], tools):
                if max_calls is None or n_calls < max_calls:
                    n_calls += 1
                    yield part("tool_call", call=call)
            n_texts = len(parser.tool_calls)
            done = max_calls is not None and n_calls >= max_calls
            if (parser.stopped_by is not None or done) and not final:
                job.cancel()  # the rest is not wanted; wait for the final event
            if final:
                break
    finally:
        if not final:
            job.cancel()
        if job.watcher is not None:
            job.watcher.cancel()
    if ev.finish_reason == "error":
        yield Finish("error", ev.usage or {}, error=ev.error, status=ev.status)
        return
    if parser.stopped_by is not None:
        reason = "stop_sequence"
    elif ev.finish_reason == "length":
        reason = "length"
    else:
        reason = "tool_calls" if n_calls else "stop"
    yield Finish(
        reason, ev.usage or {}, stop_sequence=parser.stopped_by, logprobs=pending
    )


def event_stream(events: AsyncIterator[str], headers: dict) -> StreamingResponse:
    """A streamed reply: server-sent events, as every API streams."""
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


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
    drafter = engine.drafter_name if job.speculative else "none"
    return {"x-mlx-dflash-engine": job.engine, "x-mlx-dflash-drafter": drafter}
