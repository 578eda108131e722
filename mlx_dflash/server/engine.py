"""The generation thread: it alone owns the model, the caches and the drafter.

HTTP handlers submit `Job`s; the thread runs them one at a time in FIFO order
and streams `Event`s back onto each job's asyncio queue. A job whose client
went away is cancelled between tokens and its half-used cache is dropped.
"""

import asyncio
import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from ..decode import generate_step, prefill
from ..device import backend, device_info
from ..fallback import Fallback
from ..memory import available_memory, check_memory, memory_model
from ..sampling import SamplingParams
from ..stats import SpecStats
from .metrics import Metrics
from .prompt_cache import PromptCache, load_drafter, save_drafter

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


@dataclass
class Event:
    text: str = ""
    token: Optional[int] = None
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | "error"
    error: Optional[str] = None
    usage: Optional[dict] = None
    # Tokens decoded since the last event (EOS excluded), when the job asked.
    logprobs: List[TokenLogprob] = field(default_factory=list)


@dataclass
class Job:
    prompt: List[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    logprobs: Optional[int] = None  # None, or how many top entries per token
    engine: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    watcher: Optional[asyncio.Task] = None  # see common._watch
    events: Optional[asyncio.Queue] = None
    loop: Optional[asyncio.AbstractEventLoop] = None

    def emit(self, event: Event):
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self):
        self.cancelled.set()


class Engine:
    """Owns the model on one worker thread; see the module docstring."""

    def __init__(
        self, provider: Provider, config: EngineConfig, metrics: Metrics = None
    ):
        self.config = config
        self.metrics = metrics or Metrics()
        self._provider = provider
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue()
        self._ready = threading.Event()
        self._load_error: Optional[BaseException] = None
        self.alive = False
        self.prompt_cache = (
            PromptCache(config.prompt_cache_bytes)
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

    def stop(self):
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self):
        try:
            self.target, self.tokenizer, self.drafter, self.block_size = (
                self._provider()
            )
            if self.config.max_context is None:
                args = getattr(self.target.lm, "args", None)
                self.config.max_context = getattr(args, "max_position_embeddings", None)
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
            if job.cancelled.is_set():  # its client left while it waited
                self.metrics.generations.labels(job.engine, "cancelled").inc()
                job.emit(Event(finish_reason="cancelled"))
            else:
                try:
                    self._generate(job)
                except Exception as e:  # noqa: BLE001 - the thread keeps serving
                    log.exception("generation failed")
                    job.emit(
                        Event(finish_reason="error", error=f"{type(e).__name__}: {e}")
                    )
            job.finished.set()
            del job
            if self._queue.empty():
                # Idle: hand MLX's buffer pool back to the system. Live arrays
                # (weights, prompt cache) stay; the next request re-allocates.
                mx.clear_cache()
        self.alive = False

    # ---- requests --------------------------------------------------------------

    def engine_name(self, temperature: float) -> str:
        """What serves a request: speculative (block > 1) or plain, greedy or sampling.

        Both are exact: greedy equals the target's argmax decoding, and
        speculative sampling is distributed exactly as sampling the target.
        """
        mode = "greedy" if temperature == 0 else "sampling"
        return f"{'speculative' if self.block_size > 1 else 'target'}-{mode}"

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
        job.loop = asyncio.get_running_loop()
        job.events = asyncio.Queue()
        job.engine = job.engine or self.engine_name(job.temperature)
        self._queue.put(job)
        self.metrics.queue_depth.set(self._queue.qsize())
        return job

    # ---- the generation thread -------------------------------------------------

    def _restore(self, prompt: Sequence[int]):
        """A cache (and drafter state) holding the longest reusable prefix of `prompt`."""
        entry, n, trim = (None, 0, 0)
        if self.prompt_cache is not None:
            entry, n, trim = self.prompt_cache.fetch(prompt)
        if entry is None:
            self.metrics.cache_misses.inc()
            return self.target.make_cache(), 0
        if trim:
            trim_prompt_cache(entry.cache, trim)
        load_drafter(self.drafter, entry.drafter_state)
        if trim:
            self.drafter.trim(trim)
        self.metrics.cache_hits.inc()
        return entry.cache, n

    def _generate(self, job: Job):
        target, tok = self.target, self.tokenizer
        prompt = list(job.prompt)
        eos = set(tok.eos_token_ids)
        cache, cached = self._restore(prompt)
        trimmable = all(c.is_trimmable() for c in cache)
        tic = time.perf_counter()
        run_from = cached
        if self.prompt_cache is not None and not trimmable and cached < len(prompt) - 1:
            # An untrimmable (GatedDeltaNet) cache can't be cut back later, so
            # keep a snapshot of prompt[:-1]: it serves retries of this prompt
            # and follow-ups whose history differs from our raw output.
            prefill(
                target,
                cache,
                self.drafter,
                prompt[:-1],
                cached=cached,
                step_size=self.config.prefill_step_size,
            )
            run_from = len(prompt) - 1
            self.prompt_cache.insert(
                prompt[:-1],
                copy.deepcopy(cache),
                save_drafter(self.drafter, copy_state=True),
            )
        speculative = job.engine.startswith("speculative")
        stats = SpecStats(self.block_size if speculative else 1)
        sampling = None
        if job.temperature > 0:
            sampling = SamplingParams(
                temperature=job.temperature,
                top_p=job.top_p,
                top_k=job.top_k,
                min_p=job.min_p,
                seed=job.seed,
            )
        steps = generate_step(
            target,
            prompt,
            self.drafter,
            cache=cache,
            max_tokens=job.max_tokens,
            block_size=stats.block_size,
            stop_tokens=eos,
            prefill_step_size=self.config.prefill_step_size,
            cached=run_from,
            sampling=sampling,
            logprobs=job.logprobs,
            fallback=self.config.fallback,
            stats=stats,
        )

        detok = tok.detokenizer
        out: List[int] = []
        pending: List[TokenLogprob] = []
        cancelled = False
        prefill_s = 0.0
        for step in steps:
            token = step[0]
            if not out:
                prefill_s = time.perf_counter() - tic
                tic = time.perf_counter()
            out.append(token)
            if token not in eos:
                if job.logprobs is not None:
                    pending.append((token, *step[2]))
                detok.add_token(token)
                piece = detok.last_segment  # reading it consumes it
                if piece:
                    job.emit(Event(text=piece, token=token, logprobs=pending))
                    pending = []
            if job.cancelled.is_set():
                cancelled = True
                break
        gen_s = max(time.perf_counter() - tic, 1e-9)
        detok.finalize()

        if cancelled:
            finish = "cancelled"
            if self.prompt_cache is not None and trimmable and cache:
                # Keep the prefix: an agent's next turn after a cancel (Esc in
                # Claude Code) shares it. The cache may hold a few tokens past
                # `out` (the rest of the verify cycle); trim them off.
                extra = cache[0].offset - (len(prompt) + len(out) - 1)
                assert extra >= 0, extra
                if extra:
                    trim_prompt_cache(cache, extra)
                    self.drafter.trim(extra)
                self.prompt_cache.insert(
                    prompt + out[:-1],
                    cache,
                    save_drafter(self.drafter, copy_state=False),
                )
        else:
            finish = "stop" if out and out[-1] in eos else "length"
            if self.prompt_cache is not None:
                # The cache and drafter now hold exactly prompt + out[:-1].
                self.prompt_cache.insert(
                    prompt + out[:-1],
                    cache,
                    save_drafter(self.drafter, copy_state=False),
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
        job.emit(
            Event(
                text=detok.last_segment,
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
