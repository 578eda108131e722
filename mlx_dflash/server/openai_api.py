"""OpenAI-compatible routes: /v1/chat/completions and /v1/completions."""

import json
import re
import time
import uuid
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BeforeValidator, Field, field_validator

from ..sampling import SamplingParams
from .common import (
    EFFORT_THINKING,
    APIError,
    Finish,
    check_model,
    check_template_args,
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
from .schema import Body, Lenient, bad_string

# The API documents temperature 1 for requests that name none; the server's
# --default-temperature overrides it (0: greedy, the fastest exact path).
DEFAULT_TEMPERATURE = 1.0


def _as_parts(content):
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class ContentPart(Lenient):
    type: str
    text: Optional[str] = None


class FunctionCall(Lenient):
    name: str
    arguments: Any = None  # JSON text, as the API sends it (or an object)

    @field_validator("arguments")
    @classmethod
    def _decode(cls, v):
        # Templates expect arguments as a mapping.
        if v is None or v == "":
            return {}
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError("tool call arguments are not valid JSON")
        if not isinstance(v, dict):
            raise ValueError("tool call arguments must be a JSON object")
        if bad_string(v):  # json.loads makes "\ud800" a lone surrogate
            raise ValueError(
                "tool call arguments hold a string that is not valid Unicode"
            )
        return v


class ToolCall(Lenient):
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string is one text part.
    content: Annotated[Optional[List[ContentPart]], BeforeValidator(_as_parts)] = None
    tool_calls: Optional[List[ToolCall]] = None
    tool_call_id: Optional[str] = None


class FunctionDef(Lenient):
    name: str
    description: Optional[str] = None
    parameters: Optional[Dict[str, Any]] = None


class Tool(Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


# mx.random.key takes a uint64.
_SEEDS = 2**64


class _Sampling(Body):
    model: str
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)  # extension (vLLM, llama.cpp)
    min_p: Optional[float] = Field(None, ge=0, le=1)  # extension
    seed: Optional[int] = None  # None or -1: a random seed
    stream: bool = False
    stream_options: Optional[Dict[str, Any]] = None
    stop: Union[str, List[str], None] = None
    n: int = 1
    user: Optional[str] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Dict[str, float]] = None

    @field_validator("seed")
    @classmethod
    def _seed(cls, v):
        if v == -1:
            return None  # what OpenAI clients send for "random"
        if v is not None and not 0 <= v < _SEEDS:
            raise ValueError("must be -1 (random) or an integer in [0, 2**64)")
        return v


class ChatRequest(_Sampling):
    messages: List[Message] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[List[Tool]] = None
    tool_choice: Union[str, Dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[Dict[str, Any]] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None
    store: Optional[bool] = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _switches(cls, v):
        return check_template_args(v, param="chat_template_kwargs")


class CompletionRequest(_Sampling):
    prompt: Union[str, List[int], List[str]]
    max_tokens: int = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=20)  # the API caps it at 5
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _default(cls, v):
        return 16 if v is None else v  # the API's default for null, too


def _unsupported(req: _Sampling):
    """Parameters we cannot honour are refused, never silently dropped."""
    bad = []
    if req.n != 1:
        bad.append("n")
    if req.presence_penalty or req.frequency_penalty:
        bad.append("presence_penalty/frequency_penalty")
    if req.logit_bias:
        bad.append("logit_bias")
    if isinstance(req, ChatRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(
                400, "top_logprobs requires logprobs to be true", param="top_logprobs"
            )
        if req.response_format and req.response_format.get("type") != "text":
            bad.append("response_format")
        if req.tool_choice not in (None, "auto", "none"):
            # Forcing a call needs constrained decoding, which we don't do.
            bad.append("tool_choice (only 'auto' and 'none')")
    if isinstance(req, CompletionRequest):
        if req.echo or req.suffix or (req.best_of or 1) != 1:
            bad.append("echo/suffix/best_of")
    if bad:
        raise APIError(400, f"unsupported parameter(s): {', '.join(bad)}", param=bad[0])


def _text(content: Optional[List[ContentPart]], i: int) -> str:
    out = []
    for j, p in enumerate(content or []):
        if p.type not in ("text", "input_text"):
            raise APIError(
                400,
                f"messages.{i}.content.{j}: only text content parts are supported, "
                f"not {p.type!r}",
                param="messages",
            )
        out.append(p.text or "")
    return "".join(out)


def chat_messages(messages: List[Message]) -> List[dict]:
    """OpenAI messages -> the plain dicts HF chat templates read."""
    out = []
    for i, m in enumerate(messages):
        msg = {
            "role": "system" if m.role == "developer" else m.role,
            "content": _text(m.content, i),
        }
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function", "function": c.function.model_dump()}
                for c in m.tool_calls
            ]
        out.append(msg)
    return out


def _tools(req: ChatRequest) -> Optional[List[dict]]:
    if not req.tools or req.tool_choice == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


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
        _unsupported(req)
        tools = _tools(req)
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
        lp = _ChatLogprobs(engine.tokenizer) if logprobs is not None else None
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                _chat_stream(engine, parts, head, usage_chunk, lp),
                media_type="text/event-stream",
                headers=headers,
            )
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
        body = {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": lp(tokens) if lp else None,
                    "finish_reason": _finish_reason(fin),
                }
            ],
            "usage": _usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=headers)

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
        lp = _CompletionLogprobs(engine.tokenizer) if req.logprobs is not None else None
        if req.stream:
            usage_chunk = bool((req.stream_options or {}).get("include_usage"))
            return StreamingResponse(
                _completion_stream(engine, parts, head, usage_chunk, lp),
                media_type="text/event-stream",
                headers=headers,
            )
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
        body = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "text": "".join(text),
                    "logprobs": lp(tokens) if lp else None,
                    "finish_reason": _finish_reason(fin),
                }
            ],
            "usage": _usage(fin.usage),
            "mlx_dflash": engine_info(engine, fin.usage),
        }
        return JSONResponse(body, headers=headers)

    return router


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
            if p.reason == "error":
                yield _sse(_error_body(p.error, p.status))
                break
            info = engine_info(engine, p.usage)
            yield chunk({}, _finish_reason(p), p.logprobs, mlx_dflash=info)
            if usage_chunk:
                yield _sse({**head, "choices": [], "usage": _usage(p.usage)})
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
            if p.reason == "error":
                yield _sse(_error_body(p.error, p.status))
                break
            info = engine_info(engine, p.usage)
            yield chunk("", _finish_reason(p), p.logprobs, mlx_dflash=info)
            if usage_chunk:
                yield _sse({**head, "choices": [], "usage": _usage(p.usage)})
        else:
            yield chunk(p.text, tokens=p.logprobs)
    yield "data: [DONE]\n\n"


# ---- log-probabilities -------------------------------------------------------------


def _gpt2_byte_decoder() -> Dict[str, int]:
    """Byte-level BPE's printable stand-ins for bytes (GPT-2's bytes_to_unicode)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


_BYTE_LEVEL = _gpt2_byte_decoder()
_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
    """A token's own UTF-8 bytes and display string, as the API reports them.

    Decoding one token alone drops BPE/SentencePiece leading spaces and turns
    partial UTF-8 into U+FFFD, so we read the vocabulary piece instead, the
    way mlx_lm's streaming detokenizer for this tokenizer does.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.kind = type(tokenizer.detokenizer).__name__
        self._memo: Dict[int, bytes] = {}

    def bytes(self, token: int) -> bytes:
        if token not in self._memo:
            self._memo[token] = self._bytes(token)
        return self._memo[token]

    def _bytes(self, token: int) -> bytes:
        tok = self.tokenizer
        piece = tok.convert_ids_to_tokens(token)
        if not isinstance(piece, str) or token in tok.all_special_ids:
            return tok.decode([token]).encode()
        if self.kind == "BPEStreamingDetokenizer":
            if all(c in _BYTE_LEVEL for c in piece):
                return bytes(_BYTE_LEVEL[c] for c in piece)
        elif self.kind == "SPMStreamingDetokenizer":
            m = _SPM_BYTE.fullmatch(piece)
            return (
                bytes([int(m[1], 16)]) if m else piece.replace("\u2581", " ").encode()
            )
        return tok.decode([token]).encode()

    def text(self, token: int) -> str:
        # Partial UTF-8 shows as escapes, never as U+FFFD.
        return self.bytes(token).decode("utf-8", "backslashreplace")


class _ChatLogprobs(TokenText):
    """Chat format: {"content": [{token, logprob, bytes, top_logprobs}], "refusal"}."""

    def entry(self, token: int, logprob: float) -> dict:
        return {
            "token": self.text(token),
            "logprob": logprob,
            "bytes": list(self.bytes(token)),
        }

    def __call__(self, tokens) -> dict:
        content = [
            {**self.entry(t, lp), "top_logprobs": [self.entry(*e) for e in top]}
            for t, lp, top in tokens
        ]
        return {"content": content, "refusal": None}


class _CompletionLogprobs(TokenText):
    """Legacy completions format: parallel lists plus each token's text offset."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.offset = 0  # characters of completion text so far (streams span calls)

    def __call__(self, tokens) -> dict:
        out = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for t, lp, top in tokens:
            text = self.text(t)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append({self.text(i): v for i, v in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
