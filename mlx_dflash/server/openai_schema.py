"""OpenAI request bodies (chat and legacy completions) and their translation:
the messages HF chat templates read, the tools, and what we refuse."""

import json
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import BeforeValidator, Field, field_validator

from .common import APIError, check_template_args
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


def check_supported(req: _Sampling):
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


def chat_tools(req: ChatRequest) -> Optional[List[dict]]:
    if not req.tools or req.tool_choice == "none":
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
