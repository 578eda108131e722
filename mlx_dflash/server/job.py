"""A request as the generation thread sees it: a `Job` in, `Event`s out.

HTTP handlers build a `Job` (prompt ids, `SamplingParams`, whether to
speculate) and read its `Event`s off an asyncio queue that the generation
thread fills. Either side may cancel it; `should_stop` is asked between
prefill chunks and tokens.
"""

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ..sampling import SamplingParams

# (token id, target log-probability, [(id, log-probability), ...] top entries)
TokenLogprob = Tuple[int, float, List[Tuple[int, float]]]


@dataclass
class Event:
    text: str = ""
    token: Optional[int] = None
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | "error"
    error: Optional[str] = None
    status: int = 500  # of an error: 503 shutting down, 504 timed out
    usage: Optional[dict] = None
    # Tokens decoded since the last event (EOS excluded), when the job asked.
    logprobs: List[TokenLogprob] = field(default_factory=list)


def engine_name(speculative: bool, greedy: bool) -> str:
    """What serves a request, as the x-mlx-dflash-engine header and the metrics
    name it: speculative (block > 1) or the target alone, greedy or sampling.

    Both are exact: greedy equals the target's argmax decoding, and
    speculative sampling is distributed exactly as sampling the target.
    """
    mode = "greedy" if greedy else "sampling"
    return f"{'speculative' if speculative else 'target'}-{mode}"


@dataclass
class Job:
    prompt: List[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Speculative decoding or the target alone (None: the engine's, block > 1).
    speculative: Optional[bool] = None
    logprobs: Optional[int] = None  # None, or how many top entries per token
    cache_key: Optional[str] = None  # prompt-cache namespace (the client's API key)
    text: Optional[str] = None  # the rendered chat the prompt encodes (chat APIs)
    # Reasoning tokens allowed before the engine closes the think block (think.py).
    think_budget: Optional[int] = None
    deadline: Optional[float] = None  # time.monotonic() limit
    cancelled: threading.Event = field(default_factory=threading.Event)
    reason: str = ""  # why it was cancelled: client | stalled | timeout | shutdown
    finished: threading.Event = field(default_factory=threading.Event)
    watcher: Optional[asyncio.Task] = None  # see common._watch
    events: Optional[asyncio.Queue] = None
    loop: Optional[asyncio.AbstractEventLoop] = None
    # When each event was emitted (generation thread) and how many the event
    # loop has taken: each has one writer, so `taken` indexes the oldest unread.
    emit_times: List[float] = field(default_factory=list)
    taken: int = 0

    @property
    def engine(self) -> str:
        return engine_name(bool(self.speculative), self.sampling.greedy)

    @property
    def emitted(self) -> int:
        return len(self.emit_times)

    def emit(self, event: Event):
        self.emit_times.append(time.monotonic())
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (server exit): no reader
            pass

    async def next_event(self) -> Event:
        ev = await self.events.get()
        self.taken += 1
        return ev

    def cancel(self, reason: str = "client"):
        if not self.cancelled.is_set():
            self.reason = reason
            self.cancelled.set()

    def should_stop(self, stall_seconds: float, max_unread: int) -> bool:
        """Cancelled, past its deadline, or its reader has stalled."""
        if self.cancelled.is_set():
            return True
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            self.cancel("timeout")
        taken = self.taken
        unread = self.emitted - taken
        if unread > max_unread or (
            unread and now - self.emit_times[taken] > stall_seconds
        ):
            self.cancel("stalled")
        return self.cancelled.is_set()


def stopped(reason: str, request_timeout: Optional[float], usage=None) -> Event:
    """The last event of a job that was stopped before it finished."""
    if reason == "shutdown":
        return Event(
            finish_reason="error",
            error="the server is shutting down",
            status=503,
            usage=usage,
        )
    if reason == "timeout":
        return Event(
            finish_reason="error",
            error=f"the request took longer than the server's --request-timeout "
            f"({request_timeout:g} s)",
            status=504,
            usage=usage,
        )
    return Event(finish_reason="cancelled", usage=usage)
