"""`mlx-dflash serve`: an OpenAI- and Anthropic-compatible HTTP server.

Also `python -m mlx_dflash.serve` (mlx_dflash/serve.py, a shim). Under
`mlx.launch` rank 0 serves and the other ranks follow its decoding
(lockstep.py).
"""

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import List, Optional

import uvicorn

from ..distributed import SINGLE, World
from ..drafters import DFlashDrafter
from ..load import (
    add_engine_args,
    check_engine_args,
    draft_spec,
    engine_options,
    model_name,
    one_line_errors,
)
from .app import MAX_REQUEST_BYTES

# Clients pool idle connections for as long as uvicorn's default keep-alive or
# longer (httpx, so the openai/anthropic SDKs: 5 s; Node: 4-5 s; hyper/reqwest,
# so Codex, and Go: 90 s). A request sent as the server closes its side meets a
# reset (APIConnectionError, no retry when the client turned retries off):
# keep ours open past every one of them.
KEEP_ALIVE_SECONDS = 120


def uvicorn_config(app, host: str, port: int, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=5,
    )


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_engine_args(parser)
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address (default loopback only)"
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="model id reported by /v1/models (default: the --model name)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require a key (Bearer or x-api-key) on every route but /health: "
        "one key, a comma-separated list, or a file with one key per line. "
        "Each key has its own prompt-cache entries",
    )
    parser.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=4 << 30,
        help="byte budget of the cross-request prompt cache (0 disables it)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="default max_tokens when an OpenAI request names none",
    )
    parser.add_argument(
        "--default-temperature",
        type=float,
        default=None,
        help="temperature of requests that name none (default: 1.0, as the "
        "OpenAI and Anthropic APIs document). 0 makes such requests greedy: "
        "deterministic and the fastest speculative path. Sampling is exact "
        "either way (speculative sampling matches the target's distribution)",
    )
    parser.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="reject longer prompts (default: the model's max positions)",
    )
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=None,
        help="answer 400 to requests whose estimated memory (weights + caches) "
        "exceeds this (default: what the device has free)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="end requests that take longer than this many seconds, queueing "
        "included, with a timeout error (default: no limit)",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=30.0,
        help="cancel a stream whose client has read nothing for this many "
        "seconds while output waits (default 30)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=MAX_REQUEST_BYTES,
        help=f"answer 413 to larger request bodies (default {MAX_REQUEST_BYTES >> 20} MiB)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=1,
        help="decode up to N requests at once: their blocks drafted in one "
        "draft forward and verified in one batched target forward; each "
        "request's output is still its "
        "own (greedy: token for token; sampling: the same distribution). "
        "Default 1: one at a time, first in first out",
    )
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="report ready without first running a greedy and a sampled "
        "generation (then the first request of each kind pays for the kernels "
        "backends build on first use)",
    )
    parser.add_argument("--log-level", default="info")
    return parser


def read_api_keys(value: Optional[str]) -> List[str]:
    """`--api-key`: a file of keys (one per line, # comments) or a comma list."""
    if not value:
        return []
    path = Path(value).expanduser()
    if path.is_file():
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--api-key file {path}: {e}") from None
        keys = [k.strip() for k in lines if k.strip() and not k.startswith("#")]
        if not keys:
            raise ValueError(f"--api-key file {path} holds no keys")
        return keys
    return [k.strip() for k in value.split(",") if k.strip()]


class Server(uvicorn.Server):
    """uvicorn, but SIGTERM/SIGINT first end every generation.

    uvicorn alone waits for open streams to finish (a 32k-token answer), and
    re-raises the signal afterwards. Here the engine ends running and queued
    jobs, so streams close with the API's own error event, uvicorn's
    connections drain within moments, and the process exits 0. A second
    SIGINT still forces the exit.
    """

    def __init__(self, config: uvicorn.Config, engine):
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig, frame):
        # The handler runs on the event loop's thread between any two
        # bytecodes, maybe inside `Engine.submit`'s lock: close on the loop.
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self.engine.close)
        except RuntimeError:  # no loop running (not serving yet)
            self.engine.close()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def make_provider(args, world: World = SINGLE):
    """Loads on the generation thread: MLX streams belong to their thread."""

    def provider():
        from ..device import backend, device_info, traps
        from ..load import load_pair

        log = logging.getLogger("mlx_dflash.server")
        options = engine_options(args)
        pair = load_pair(args.model, args.draft, **options, world=world)
        if isinstance(pair.drafter, DFlashDrafter):
            log.info(
                "drafter dtype %s: %s", pair.draft_dtype.name, pair.draft_dtype.reason
            )
        for trap in traps(device_info(), backend(), dtype=options["dtype"]):
            log.warning(trap)
        return pair.target, pair.tokenizer, pair.drafter, pair.block_size

    return provider


def main(argv=None):
    parser = build_parser(
        argparse.ArgumentParser(
            prog="mlx-dflash serve",
            description="Serve a model with DFlash speculative decoding over the OpenAI "
            "and Anthropic HTTP APIs. Under mlx.launch the target is split across the "
            "ranks and rank 0 serves (no prompt cache or fallback there).",
        )
    )
    args = parser.parse_args(argv)
    if args.default_temperature is not None and args.default_temperature < 0:
        parser.error("--default-temperature must be >= 0")
    if args.max_batch < 1:
        parser.error("--max-batch must be >= 1")
    for flag in ("request_timeout", "stall_timeout", "max_request_bytes"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be > 0")
    with one_line_errors(parser):
        api_keys = read_api_keys(args.api_key)
        check_engine_args(args)
        args.draft = draft_spec(args.model, args.draft)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    from ..decode import generate_step
    from ..fallback import Fallback
    from ..load import load_pair
    from ..lockstep import Leader, follow
    from . import Engine, EngineConfig, create_app

    world = World.init(pipeline=args.pipeline)
    if world.size > 1 and args.max_batch > 1:  # every rank stops here
        parser.error("--max-batch > 1 is not supported across ranks (mlx.launch)")
    if not world.leader:
        with one_line_errors(parser):
            pair = load_pair(args.model, args.draft, **engine_options(args), world=world)
        follow(world, pair.target, pair.drafter)
        return
    if world.size > 1:
        # The fallback's timing and the prompt cache's reuse are rank 0's
        # alone; the followers could not make the same choices.
        args.no_fallback, args.prompt_cache_bytes = True, 0

    config = EngineConfig(
        model_name=args.served_model_name or model_name(args.model),
        prompt_cache_bytes=args.prompt_cache_bytes,
        max_context=args.max_context,
        prefill_step_size=args.prefill_step_size,
        default_max_tokens=args.max_tokens,
        default_temperature=args.default_temperature,
        fallback=None if args.no_fallback else Fallback(),
        chat_template_args=args.chat_template_args,
        max_memory=(
            None if args.max_memory_gb is None else int(args.max_memory_gb * 1e9)
        ),
        request_timeout=args.request_timeout,
        stall_seconds=args.stall_timeout,
        warm_up=not args.no_warm_up,
        max_batch=args.max_batch,
        distributed=world.info(),
    )
    steps = Leader(world) if world.size > 1 else generate_step
    with one_line_errors(parser):
        engine = Engine(make_provider(args, world), config, steps=steps).start()
    logging.getLogger("mlx_dflash.server").info(
        "serving %s (drafter %s, block %d, default temperature %s) on http://%s:%d",
        config.model_name,
        engine.drafter_name,
        engine.block_size,
        (
            "per API (1.0)"
            if args.default_temperature is None
            else args.default_temperature
        ),
        args.host,
        args.port,
    )
    app = create_app(
        engine, api_key=api_keys, max_request_bytes=args.max_request_bytes
    )
    config = uvicorn_config(app, args.host, args.port, args.log_level.lower())
    try:
        Server(config, engine).run()
    finally:
        engine.stop(timeout=5)
        if world.size > 1:
            if engine.alive:  # still generating, mid-collective: end every rank
                world.fail("the generation thread did not stop")
            steps.exit()


if __name__ == "__main__":
    main()
