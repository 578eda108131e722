"""Anthropic Messages replies: usage, errors, content blocks and the stream's
events (message_start, content_block_start/delta/stop, message_delta,
message_stop, or error).
"""

import json
import uuid

from .common import ANTHROPIC_ERROR_TYPES, Finish, engine_info

STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "stop_sequence": "stop_sequence",
    "tool_calls": "tool_use",
}


def usage(u: dict) -> dict:
    # Anthropic counts cache reads apart: input_tokens is the uncached remainder.
    return {
        "input_tokens": u.get("prompt_tokens", 0) - u.get("cached_tokens", 0),
        "cache_read_input_tokens": u.get("cached_tokens", 0),
        "cache_creation_input_tokens": 0,
        "output_tokens": u.get("completion_tokens", 0),
    }


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_body(message: str, status: int = 500) -> dict:
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def tool_use(call: dict) -> dict:
    return {
        "type": "tool_use",
        "id": f"toolu_{uuid.uuid4().hex[:24]}",
        "name": call["name"],
        "input": call["arguments"],
    }


async def stream(engine, parts, head, n_prompt):
    start = {
        **head,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": n_prompt, "output_tokens": 0},
    }
    yield event("message_start", {"type": "message_start", "message": start})
    yield event("ping", {"type": "ping"})
    index, open_kind = -1, None

    def close():
        out = []
        if open_kind == "thinking":
            out.append(
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "signature_delta", "signature": ""},
                    },
                )
            )
        if open_kind is not None:
            out.append(
                event(
                    "content_block_stop", {"type": "content_block_stop", "index": index}
                )
            )
        return out

    async for p in parts:
        if isinstance(p, Finish):
            for e in close():
                yield e
            if p.reason == "error":
                yield event("error", error_body(p.error, p.status))
                return
            yield event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": STOP_REASON[p.reason],
                        "stop_sequence": p.stop_sequence,
                    },
                    "usage": usage(p.usage),
                    "mlx_dflash": engine_info(engine, p.usage),
                },
            )
            yield event("message_stop", {"type": "message_stop"})
            return
        kind = {"text": "text", "reasoning": "thinking"}.get(p.kind, "tool_use")
        if kind != open_kind or kind == "tool_use":
            for e in close():
                yield e
            index += 1
            open_kind = kind
            if kind == "tool_use":
                block = tool_use(p.call)
                args = json.dumps(block["input"], ensure_ascii=False)
                block["input"] = {}
            else:
                block = {"type": kind, kind: ""} | (
                    {"signature": ""} if kind == "thinking" else {}
                )
            yield event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        if kind == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": args}
        elif kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": p.text}
        else:
            delta = {"type": "text_delta", "text": p.text}
        yield event(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": delta},
        )
