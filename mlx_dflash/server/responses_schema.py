"""Responses API requests: the body, and its input items as chat-template messages.

`input` is a string or items (messages, `function_call`, `function_call_output`,
`reasoning`); function and `namespace` tools pass through, hosted tools are
dropped. Everything is checked here, so a malformed request is a 400 naming
the field.
"""

import json
import logging
import math
from types import NoneType
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import Field, model_validator

from .common import APIError
from .schema import Body, Lenient, bad_string

log = logging.getLogger("mlx_dflash.server")

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


def request_tools(req: ResponsesRequest) -> Tuple[Optional[list], Dict[str, str]]:
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


def template_args(req: ResponsesRequest) -> Optional[dict]:
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


def input_items(input_) -> List[dict]:
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
