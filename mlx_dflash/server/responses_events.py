"""Responses API output: items and the stream events that build them.

One builder (`Output`) serves both modes, so streamed and non-streamed
responses cannot drift apart; every event carries its `sequence_number`.
"""

import json
import time
import uuid
from typing import Dict, List, Optional

from .common import Finish, Part
from .responses_schema import Reasoning, ResponsesRequest


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class Output:
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
            body["usage"] = response_usage(fin.usage, reasoning)
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


def response_head(req: ResponsesRequest, tools: Optional[list], temperature: float) -> dict:
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
STATUS = {"error": "failed", "length": "incomplete"}
LAST_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


def response_usage(u: dict, reasoning_tokens: int) -> dict:
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


def error_body(message: str, status: int = 500) -> dict:
    code = {503: "server_shutting_down", 504: "timeout"}.get(status)
    return {
        "error": {
            "message": message,
            "type": "server_error",
            "param": None,
            "code": code,
        }
    }


def sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


# ---- routes -------------------------------------------------------------------------
