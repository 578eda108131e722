"""Prometheus metrics, one registry per app (tests start many apps in one process)."""

import mlx.core as mx
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "mlx_dflash_requests",
            "HTTP generation requests",
            ["api", "status"],
            registry=r,
        )
        self.generations = Counter(
            "mlx_dflash_generations",
            "finished generations by engine and finish reason",
            ["engine", "finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "mlx_dflash_prompt_tokens", "prompt tokens received", registry=r
        )
        self.cached_tokens = Counter(
            "mlx_dflash_prompt_cached_tokens",
            "prompt tokens served from the prompt cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "mlx_dflash_generation_tokens", "tokens generated", registry=r
        )
        self.drafted = Counter(
            "mlx_dflash_drafted_tokens",
            "draft tokens proposed for verification",
            registry=r,
        )
        self.accepted = Counter(
            "mlx_dflash_accepted_tokens",
            "draft tokens accepted by the target",
            registry=r,
        )
        self.cycles = Counter(
            "mlx_dflash_verify_cycles", "speculative verify cycles", registry=r
        )
        self.cache_hits = Counter(
            "mlx_dflash_prompt_cache_hits",
            "requests that reused a cached prefix",
            registry=r,
        )
        self.cache_misses = Counter(
            "mlx_dflash_prompt_cache_misses",
            "requests prefilled from scratch",
            registry=r,
        )
        self.cache_bytes = Gauge(
            "mlx_dflash_prompt_cache_bytes",
            "bytes held by the prompt cache",
            registry=r,
        )
        self.queue_depth = Gauge(
            "mlx_dflash_queue_depth",
            "requests waiting for the generation thread",
            registry=r,
        )
        self.batch_size = Gauge(
            "mlx_dflash_batch_size",
            "requests in the batched verify (serve --max-batch)",
            registry=r,
        )
        self.rows_waiting = Gauge(
            "mlx_dflash_rows_waiting",
            "requests waiting for a place in the batch (serve --max-batch)",
            registry=r,
        )
        self.tau = Gauge(
            "mlx_dflash_last_tau",
            "mean accepted length per cycle (bonus included) of the last generation",
            registry=r,
        )
        self.generation_tau = Histogram(
            "mlx_dflash_tau",
            "mean accepted length per cycle (bonus included), one per speculative generation",
            buckets=(1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 32, 64),
            registry=r,
        )
        self.row_tau = Gauge(
            "mlx_dflash_batch_row_tau",
            "mean accepted length so far of each request in the batch, by its place in it",
            ["row"],
            registry=r,
        )
        self.acceptance = Gauge(
            "mlx_dflash_last_acceptance_rate",
            "accepted / drafted tokens of the last generation (per drafted token)",
            registry=r,
        )
        self.generation_tps = Gauge(
            "mlx_dflash_last_generation_tps",
            "tokens/s of the last generation",
            registry=r,
        )
        self.prefill_seconds = Histogram(
            "mlx_dflash_prefill_seconds", "prompt prefill time", registry=r
        )
        # Read at scrape time. process_resident_memory_bytes (Linux) comes
        # with the process collector.
        ProcessCollector(registry=r)
        memory = {
            "active": ("arrays alive in MLX", mx.get_active_memory),
            "cache": ("freed buffers MLX keeps for reuse", mx.get_cache_memory),
            "peak": ("MLX peak memory since start", mx.get_peak_memory),
        }
        for name, (doc, read) in memory.items():
            Gauge(f"mlx_dflash_mlx_{name}_memory_bytes", doc, registry=r).set_function(
                read
            )
