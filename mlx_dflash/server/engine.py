"""The generation thread: it alone owns the model, the caches and the drafter.

HTTP handlers submit `Job`s; the thread runs them one at a time in FIFO order
and streams `Event`s back onto each job's asyncio queue. A job stops between
prefill chunks or tokens when its client went away, stopped reading for
longer than `stall_seconds`, passed its deadline, or the server shuts down.
"""

import asyncio
import dataclasses
import gc
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import mlx.core as mx

from ..decode import Cancelled, generate_step, prefill
from ..device import backend, device_info
from ..fallback import Fallback
from ..memory import available_memory, check_memory, memory_model
from ..sampling import SamplingParams
from ..stats import SpecStats
from .metrics import Metrics
from .prompt_cache import PromptCache
from .think import ThinkBudget, opens_think

log = logging.getLogger("mlx_dflash.server")

# (target, tokenizer, drafter, block_size); called on the generation thread,
# since MLX streams belong to the thread that creates them.
Provider = Callable[[], Tuple[Any, Any, Any, int]]

# (token id, target log-probability, [(id, log-probability), ...] top entries)
TokenLogprob = Tuple[int, float, List[Tuple[int, float]]]


@dataclass
class EngineConfig:
    model_name: str = "default"
    prompt_cache_bytes: int = 4 << 30
    max_context: Optional[int] = None  # default: the model's max_position_embeddings
    prefill_step_size: int = 2048
    default_max_tokens: int = 4096
    # Temperature of requests that name none; None: each API's documented default.
    default_temperature: Optional[float] = None
    chat_template_args: dict = field(default_factory=dict)
    # Plain decoding while speculation does not pay (None: always speculate).
    fallback: Optional[Fallback] = field(default_factory=Fallback)
    # Cap in bytes on this process's memory (None: what the device has free).
    max_memory: Optional[int] = None
    # Wall-clock limit of one request, queueing included (None: no limit).
    request_timeout: Optional[float] = None
    # A stream whose client has read nothing for this long while output waits
    # (or that has more than `max_unread` events unread) is cancelled.
    stall_seconds: float = 30.0
    max_unread: int = 4096
    # Reply tokens between the prompt cache's cut points (for GatedDeltaNet
    # models each point holds a copy of the recurrent state).
    reply_point_tokens: int = 256
    # The ranks the target is split across (distributed.World.info()).
    distributed: dict = field(
        default_factory=lambda: {"world_size": 1, "backend": None, "mode": "single"}
    )


# Context window of models whose config names none (max_position_embeddings).
DEFAULT_MAX_CONTEXT = 32768


class ShuttingDown(Exception):
    """`submit` after `close`: the server no longer takes requests."""


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
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

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


class Engine:
    """Owns the model on one worker thread; see the module docstring."""

    def __init__(
        self,
        provider: Provider,
        config: EngineConfig,
        metrics: Metrics = None,
        steps=generate_step,
    ):
        self.config = config
        self.steps = steps  # decode.generate_step, or lockstep.Leader across ranks
        self.metrics = metrics or Metrics()
        self._provider = provider
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._ready = threading.Event()
        self._load_error: Optional[BaseException] = None
        self._lock = threading.Lock()  # orders submit() against close()
        self._current: Optional[Job] = None
        self.alive = False
        self.closing = False
        # Templating and tokenisation of requests: off the event loop, one at a
        # time (a fast tokenizer must not be used by two threads at once).
        self.text_pool = ThreadPoolExecutor(1, thread_name_prefix="mlx-dflash-text")
        self.prompt_cache = (
            PromptCache(
                config.prompt_cache_bytes, point_tokens=config.reply_point_tokens
            )
            if config.prompt_cache_bytes > 0
            else None
        )
        self._thread = threading.Thread(
            target=self._run, name="mlx-dflash-gen", daemon=True
        )

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> "Engine":
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        return self

    def close(self):
        """Refuse new jobs, end queued ones and cancel the running one.

        Safe from a signal handler: it only sets flags and queues events.
        """
        with self._lock:
            if self.closing:
                return
            self.closing = True
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    self._refuse(job)
                    job.finished.set()
            self._queue.put(None)
        job = self._current
        if job is not None:
            job.cancel("shutdown")

    def stop(self, timeout: float = 10.0):
        self.close()
        self._thread.join(timeout=timeout)
        self.text_pool.shutdown(wait=False, cancel_futures=True)

    def _refuse(self, job: Job):
        self.metrics.generations.labels(job.engine, "cancelled").inc()
        job.emit(_stopped(job.reason or "shutdown", self.config))

    def _run(self):
        try:
            self.target, self.tokenizer, self.drafter, self.block_size = (
                self._provider()
            )
            if self.config.max_context is None:
                args = getattr(self.target.lm, "args", None)
                text = getattr(args, "text_config", None) or {}
                self.config.max_context = (
                    getattr(args, "max_position_embeddings", None)
                    or text.get("max_position_embeddings")
                    or DEFAULT_MAX_CONTEXT
                )
            self.memory = memory_model(self.target, self.drafter)
            self.device = (device_info(), backend())
            self.alive = True
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._load_error = e
        finally:
            self._ready.set()
        while self.alive:
            job = self._queue.get()
            if job is None:
                break
            self.metrics.queue_depth.set(self._queue.qsize())
            self._current = job
            if self.closing:
                job.cancel("shutdown")
            if self._should_stop(job):  # cancelled or expired while it waited
                self._refuse(job)
            else:
                try:
                    self._generate(job)
                except Exception as e:  # noqa: BLE001 - the thread keeps serving
                    log.exception("generation failed")
                    job.emit(
                        Event(finish_reason="error", error=f"{type(e).__name__}: {e}")
                    )
            self._current = None
            job.finished.set()
            del job
            if self._queue.empty():
                # Idle: free what a finished generation left in reference
                # cycles (its arrays would otherwise live until Python's next
                # collection), then hand MLX's buffer pool back to the system.
                # Live arrays (weights, prompt cache) stay.
                gc.collect()
                mx.clear_cache()
        self.alive = False

    # ---- requests --------------------------------------------------------------

    def engine_name(self, temperature: float) -> str:
        """`engine_name` of this engine's requests at `temperature`."""
        return engine_name(self.block_size > 1, temperature == 0)

    def temperature(self, requested: Optional[float], api_default: float) -> float:
        """The request's temperature, else `--default-temperature`, else the API's."""
        if requested is not None:
            return requested
        if self.config.default_temperature is not None:
            return self.config.default_temperature
        return api_default

    @property
    def drafter_name(self) -> str:
        return self.drafter.name if self.block_size > 1 else "none"

    def check_memory(self, prompt_tokens: int, max_tokens: Optional[int]):
        """Raise a one-line ValueError when a request would not fit in memory.

        Arithmetic only, safe off the generation thread. Prompt-cache entries
        count as free: they are evicted before a request is refused for them.
        """
        info, where = self.device
        estimate = self.memory.estimate(
            prompt_tokens,
            max_tokens or self.config.default_max_tokens,
            block_size=self.block_size,
            prefill_step=self.config.prefill_step_size,
            backend=where,
        )
        available = available_memory(info, where, limit=self.config.max_memory)
        if available is not None and self.prompt_cache is not None:
            available += self.prompt_cache.nbytes
        check_memory(estimate, available)

    def submit(self, job: Job) -> Job:
        """Queue `job`; raises `ShuttingDown` once `close` has been called."""
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        if job.speculative is None:
            job.speculative = self.block_size > 1
        if self.config.request_timeout is not None:
            job.deadline = time.monotonic() + self.config.request_timeout
        with self._lock:
            if self.closing or not self.alive:
                raise ShuttingDown("the server is shutting down")
            self._queue.put(job)
        self.metrics.queue_depth.set(self._queue.qsize())
        return job

    def _should_stop(self, job: Job) -> bool:
        return job.should_stop(self.config.stall_seconds, self.config.max_unread)

    # ---- the generation thread -------------------------------------------------

    def _restore(self, job: Job):
        """A cache (and drafter state) holding the longest reusable prefix of
        the job's prompt, and the prompt to run (see `PromptCache.fetch`)."""
        hit = None
        if self.prompt_cache is not None:
            hit = self.prompt_cache.restore(
                job.prompt,
                self.drafter,
                job.cache_key,
                text=job.text,
                encode=self._encode,
            )
        if hit is None:
            self.metrics.cache_misses.inc()
            return self.target.make_cache(), 0, list(job.prompt)
        self.metrics.cache_hits.inc()
        return hit.cache, hit.n, hit.prompt

    def _encode(self, text: str) -> List[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _think_budget(self, job: Job) -> Optional[ThinkBudget]:
        tok = self.tokenizer
        if job.think_budget is None or not tok.has_thinking:
            return None
        return ThinkBudget(
            job.think_budget,
            tuple(tok.think_start_tokens),
            tuple(tok.think_end_tokens),
            inside=opens_think(tok, job.prompt),
        )

    def _generate(self, job: Job):
        target, tok = self.target, self.tokenizer
        eos = set(tok.eos_token_ids)
        cache, cached, prompt = self._restore(job)
        if len(prompt) != len(job.prompt):  # the previous reply's own ids
            room = (self.config.max_context or len(prompt) + 1) - len(prompt)
            job.max_tokens = max(1, min(job.max_tokens, room))
        pc, key = self.prompt_cache, job.cache_key
        should_stop = lambda: self._should_stop(job)  # noqa: E731
        tic = time.perf_counter()
        run_from = cached
        context = prompt  # what this segment of the output continues
        try:
            snapshot = None
            if pc is not None:
                snapshot = pc.snapshot_at(cache, cached, len(prompt))
            if snapshot is not None:
                prefill(
                    target,
                    cache,
                    self.drafter,
                    prompt[:snapshot],
                    cached=cached,
                    step_size=self.config.prefill_step_size,
                    should_stop=should_stop,
                )
                run_from = snapshot
                pc.snapshot(prompt[:snapshot], cache, self.drafter, key)
            speculative = job.speculative
            stats = SpecStats(self.block_size if speculative else 1)
            sampling = None if job.sampling.greedy else job.sampling
            think = self._think_budget(job)
            detok = tok.detokenizer
            points = None if pc is None else pc.recorder(cache, len(prompt), job.text)
            out: List[int] = []
            pending: List[TokenLogprob] = []
            cancelled = started = False
            prefill_s = 0.0
            while True:
                if think is not None and think.overdue():
                    # Budget spent: the think end goes into the output and the
                    # next segment continues after it.
                    if len(out) + len(think.end) > job.max_tokens:
                        break
                    for token in think.end:
                        if points is not None:
                            points.before(len(out), detok)
                        out.append(token)
                        think.observe(out)
                        detok.add_token(token)
                        piece = detok.last_segment
                        if piece:
                            if points is not None:
                                points.sent(piece)
                            job.emit(Event(text=piece, token=token))
                room = job.max_tokens - len(out)
                context = prompt + out
                if out and sampling is not None and sampling.seed is not None:
                    # A seeded job's later segments must not replay its first keys.
                    sampling = dataclasses.replace(
                        sampling, seed=job.sampling.seed + len(out)
                    )
                steps = self.steps(
                    target,
                    context,
                    self.drafter,
                    cache=cache,
                    max_tokens=room if think is None else think.limit(room),
                    block_size=stats.block_size,
                    stop_tokens=eos if think is None else eos | think.stops(),
                    prefill_step_size=self.config.prefill_step_size,
                    cached=run_from,
                    sampling=sampling,
                    logprobs=job.logprobs,
                    fallback=self.config.fallback,
                    stats=stats,
                    should_stop=should_stop,
                )
                for step in steps:
                    token = step[0]
                    if not started:
                        started = True
                        prefill_s = time.perf_counter() - tic
                        tic = time.perf_counter()
                    if points is not None:
                        points.before(len(out), detok)
                    out.append(token)
                    if think is not None:
                        think.observe(out)
                    if token not in eos:
                        if job.logprobs is not None:
                            pending.append((token, *step[2]))
                        detok.add_token(token)
                        piece = detok.last_segment  # reading it consumes it
                        if piece:
                            if points is not None:
                                points.sent(piece)
                            job.emit(Event(text=piece, token=token, logprobs=pending))
                            pending = []
                    if should_stop():
                        cancelled = True
                        steps.close()  # rewinds the caches to prompt + out[:-1]
                        break
                if cancelled or out[-1] in eos or len(out) >= job.max_tokens:
                    break
                # A segment ended at a think decision; it ran to its end, so the
                # caches hold prompt + out[:-1]: the next one prefills from there.
                assert think is not None
                run_from = len(prompt) + len(out) - 1
        except Cancelled as e:
            # Stopped mid-prefill: the chunks already run are a valid prefix
            # (a retry of an abandoned request starts from there).
            if pc is not None:
                pc.keep(context[: e.filled], cache, self.drafter, key)
            self._refuse(job)
            return
        gen_s = max(time.perf_counter() - tic, 1e-9)
        detok.finalize()
        tail = detok.last_segment
        if points is not None:
            points.sent(tail)

        if cancelled:
            finish = "cancelled"
            if pc is not None:
                pc.keep_cancelled(prompt + out[:-1], cache, self.drafter, key)
        else:
            finish = "stop" if out and out[-1] in eos else "length"
            # The cache and drafter now hold exactly prompt + out[:-1].
            if pc is not None:
                pc.keep_finished(
                    prompt + out[:-1],
                    cache,
                    self.drafter,
                    key,
                    points=points,
                    stopped=finish == "stop",
                )
        usage = {
            "prompt_tokens": len(prompt),
            "cached_tokens": cached,
            "completion_tokens": len(out),
            "prefill_seconds": round(prefill_s, 4),
            "prefill_tps": round((len(prompt) - cached) / max(prefill_s, 1e-9), 2),
            "generation_tps": round(len(out) / gen_s, 2),
            "engine": job.engine,
            "drafter": self.drafter_name if speculative else "none",
            "block_size": stats.block_size,
            "spec": stats.as_dict() if stats.block_size > 1 else None,
        }
        self._record(job, finish, usage, stats, prefill_s)
        if cancelled:
            event = _stopped(job.reason, self.config, usage=usage)
            event.text = tail
            event.logprobs = pending
            job.emit(event)
            return
        job.emit(
            Event(
                text=tail,
                finish_reason=finish,
                usage=usage,
                logprobs=pending,
            )
        )

    def _record(self, job, finish, usage, stats, prefill_s):
        m = self.metrics
        m.generations.labels(job.engine, finish).inc()
        m.prompt_tokens.inc(usage["prompt_tokens"])
        m.cached_tokens.inc(usage["cached_tokens"])
        m.generation_tokens.inc(usage["completion_tokens"])
        m.prefill_seconds.observe(prefill_s)
        m.generation_tps.set(usage["generation_tps"])
        if stats.cycles:
            m.drafted.inc(stats.drafted)
            m.accepted.inc(stats.accepted)
            m.cycles.inc(stats.cycles)
            m.tau.set(stats.tau)
        if stats.drafted:  # lookup cycles can draft nothing: no rate to report
            m.acceptance.set(stats.acceptance_rate)
        if self.prompt_cache is not None:
            m.cache_bytes.set(self.prompt_cache.nbytes)


def _stopped(reason: str, config: EngineConfig, usage=None) -> Event:
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
            f"({config.request_timeout:g} s)",
            status=504,
            usage=usage,
        )
    return Event(finish_reason="cancelled", usage=usage)
