"""The generation thread: it alone owns the model, the caches and the drafter.

The thread loads the model and warms it (a greedy and a sampled generation,
warmup.py) before `start` returns, so the first request pays no first-use
builds. HTTP handlers submit `Job`s (job.py); the thread runs them one at a
time in FIFO order (generation.py runs one) and streams `Event`s back onto
each job's asyncio queue. With `max_batch` > 1 it runs up to that many at
once: every job's generation runs until its row waits, then one batched
verify serves them all (batch.py); queued jobs join between cycles, after
their own prefill, and each gets its own drafter. A job stops between prefill
chunks or tokens when its client went away, stopped reading for longer than
`stall_seconds`, passed its deadline, or the server shuts down.
"""

import asyncio
import copy
import gc
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

import mlx.core as mx

from ..batch import Batch
from ..decode import generate_step
from ..device import backend, device_info
from ..fallback import Fallback
from ..memory import available_memory, check_memory, memory_model
from ..sampling import SamplingParams
from ..warmup import warm_up
from .generation import generate
from .job import Event, Job, engine_name, stopped
from .metrics import Metrics
from .prompt_cache import PromptCache

log = logging.getLogger("mlx_dflash.server")

# (target, tokenizer, drafter, block_size); called on the generation thread,
# since MLX streams belong to the thread that creates them.
Provider = Callable[[], Tuple[Any, Any, Any, int]]

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
    # Run greedy and sampled generations before reporting ready, so that no
    # request pays for what backends build on first use (warmup.py).
    warm_up: bool = True
    # Requests decoded together, verified in one batched forward (batch.py);
    # 1: one at a time, first in first out.
    max_batch: int = 1
    # The ranks the target is split across (distributed.World.info()).
    distributed: dict = field(
        default_factory=lambda: {"world_size": 1, "backend": None, "mode": "single"}
    )


# Context window of models whose config names none (max_position_embeddings).
DEFAULT_MAX_CONTEXT = 32768


class ShuttingDown(Exception):
    """`submit` after `close`: the server no longer takes requests."""


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
        self._batched: List[Job] = []  # the jobs in the batch (max_batch > 1)
        self.batch: Optional[Batch] = None
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

        Every open stream gets its last event now, from here: the running
        job's reader need not wait for the generation thread to look up (a
        prefill chunk of a large model can outlast uvicorn's grace period).
        That thread's own last event for it comes after this one; nobody
        reads it. From a signal handler, call it through the event loop
        (server/cli.py): the handler may have interrupted `submit`.
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
                    self.refuse(job)
                    job.finished.set()
            self._queue.put(None)
        running = [self._current] if self._current is not None else []
        for job in running + list(self._batched):
            job.cancel("shutdown")
            job.emit(stopped(job.reason, self.config.request_timeout))

    def stop(self, timeout: float = 10.0):
        self.close()
        self._thread.join(timeout=timeout)
        self.text_pool.shutdown(wait=False, cancel_futures=True)

    def refuse(self, job: Job):
        self.metrics.generations.labels(job.engine, "cancelled").inc()
        job.emit(stopped(job.reason or "shutdown", self.config.request_timeout))

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
            if self.config.warm_up:
                warm_up(
                    self.target,
                    self.drafter,
                    self.block_size,
                    self.warm_settings(),
                    steps=self.steps,  # across ranks, every rank warms in step
                )
                mx.clear_cache()
            if self.config.max_batch > 1:
                self._new_batch()
            self.alive = True
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._load_error = e
        finally:
            self._ready.set()
        if self.config.max_batch > 1:
            self._serve_batched()
        else:
            self._serve_one_at_a_time()
        self.alive = False

    def _new_batch(self):
        self.batch = Batch(self.target, prefill_step_size=self.config.prefill_step_size)
        self.steps = self.batch.steps

    def _serve_one_at_a_time(self):
        while self.alive:
            job = self._queue.get()
            if job is None:
                break
            self.metrics.queue_depth.set(self._queue.qsize())
            self._current = job
            if self.closing:
                job.cancel("shutdown")
            if self.should_stop(job):  # cancelled or expired while it waited
                self.refuse(job)
            else:
                for _ in self._advance(job, generate(self, job)):
                    pass  # one at a time: a generation never waits
            self._current = None
            job.finished.set()
            del job
            if self._queue.empty():
                self._idle()

    def _serve_batched(self):
        """Up to `max_batch` jobs: each job's generation runs until its row
        waits for the batch (a new one prefills first), then one cycle."""
        running = []  # (job, its generation: generation.py's generator)
        stopping = not self.alive
        while running or not stopping:
            while not stopping and len(running) < self.config.max_batch:
                try:
                    job = self._queue.get(block=not running)
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                if self.closing:
                    job.cancel("shutdown")
                if self.should_stop(job):  # cancelled or expired while it waited
                    self.refuse(job)
                    job.finished.set()
                    continue
                running.append((job, self._advance(job, generate(self, job))))
                self._batched.append(job)
            self.metrics.queue_depth.set(self._queue.qsize())
            self.metrics.rows_waiting.set(self._queue.qsize())
            for pair in list(running):
                job, gen = pair
                if next(gen, None) is None:  # finished (or failed)
                    running.remove(pair)
                    self._batched.remove(job)
                    job.finished.set()
            self.metrics.batch_size.set(len(self.batch))
            self._row_metrics()
            if self.batch.rows:
                self._cycle(running)
            elif not running and self._queue.empty():
                self._idle()
        self._batched.clear()

    def _row_metrics(self):
        """Each batch row's τ so far, labelled by its place in the batch."""
        gauge = self.metrics.row_tau
        gauge.clear()
        for b, row in enumerate(self.batch.rows):
            tau = row.decoding.stats.tau
            if tau is not None:
                gauge.labels(row=str(b)).set(tau)

    def _cycle(self, running):
        """One batched cycle; if it fails, every job in it ends with the error."""
        try:
            self.batch.step()
        except Exception as e:  # noqa: BLE001 - the thread keeps serving
            log.exception("batched cycle failed")
            for job, gen in running:
                job.emit(Event(finish_reason="error", error=f"{type(e).__name__}: {e}"))
                job.cancel("error")
                try:
                    gen.close()
                except Exception:  # noqa: BLE001 - the batch is dropped anyway
                    log.exception("closing a failed batch's generation")
                self._batched.remove(job)
                job.finished.set()
            running.clear()
            self._new_batch()

    def _advance(self, job: Job, gen):
        """`gen` (a job's generation), yielding True while it waits; a failure
        ends the job with an error event and the thread keeps serving."""
        try:
            for _ in gen:
                yield True
        except Exception as e:  # noqa: BLE001 - the thread keeps serving
            log.exception("generation failed")
            job.emit(Event(finish_reason="error", error=f"{type(e).__name__}: {e}"))

    def _idle(self):
        # Free what a finished generation left in reference cycles (its
        # arrays would otherwise live until Python's next collection), then
        # hand MLX's buffer pool back to the system. Live arrays (weights,
        # prompt cache) stay.
        gc.collect()
        mx.clear_cache()

    def warm_settings(self) -> List[SamplingParams]:
        """Greedy, the APIs' default temperature and the server's own default."""
        temps = {0.0, 1.0, self.config.default_temperature or 0.0}
        return [SamplingParams(temperature=t) for t in sorted(temps)]

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

    def drafter_for(self, job: Job):
        """The drafter `job` decodes with: the engine's own one at a time; in a
        batch each job's own (a drafter holds one sequence's context; a copy
        shares the draft model and begins empty, or with a prompt-cache
        entry's state)."""
        if self.config.max_batch == 1:
            return self.drafter
        return copy.copy(self.drafter)

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

    def should_stop(self, job: Job) -> bool:
        return job.should_stop(self.config.stall_seconds, self.config.max_unread)
