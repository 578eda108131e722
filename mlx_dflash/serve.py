"""`mlx-dflash serve`: an OpenAI- and Anthropic-compatible HTTP server."""

import argparse
import logging
from pathlib import Path

import mlx.core as mx

from .load import add_engine_args, check_engine_args, local_path, one_line_errors


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
        help="require this key (Bearer or x-api-key) on every route but /health",
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
    parser.add_argument("--log-level", default="info")
    return parser


def make_provider(args):
    """Loads on the generation thread: MLX streams belong to their thread."""

    def provider():
        from .device import backend, device_info, draft_dtype, traps
        from .load import load_target, make_drafter

        log = logging.getLogger("mlx_dflash.server")
        dtype = getattr(mx, args.dtype) if args.dtype else None
        target, tokenizer = load_target(args.model, dtype=dtype)
        info, where = device_info(), backend()
        policy = draft_dtype(info, where, requested=dtype)
        drafter, native = make_drafter(
            args.draft, target, dtype=policy.dtype, quantize=args.draft_quantize
        )
        block_size = args.block_size or native or 16
        if hasattr(drafter, "draft"):
            log.info("drafter dtype %s: %s", policy.name, policy.reason)
        for trap in traps(info, where, dtype=dtype):
            log.warning(trap)
        return target, tokenizer, drafter, block_size

    return provider


def main(argv=None):
    parser = build_parser(
        argparse.ArgumentParser(
            prog="mlx-dflash serve",
            description="Serve a model with DFlash speculative decoding over the OpenAI "
            "and Anthropic HTTP APIs.",
        )
    )
    args = parser.parse_args(argv)
    if args.default_temperature is not None and args.default_temperature < 0:
        parser.error("--default-temperature must be >= 0")
    with one_line_errors(parser):
        check_engine_args(args)
        if args.model is not None and args.draft is None:
            from .registry import draft_for

            local_path(args.model, "--model")  # a missing path, not an unknown target
            args.draft = draft_for(args.model)
    if args.model is None:
        from .gguf import find_default_gguf

        args.model = str(find_default_gguf())
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    import uvicorn

    from .fallback import Fallback
    from .server import Engine, EngineConfig, create_app

    config = EngineConfig(
        model_name=args.served_model_name or Path(str(args.model).rstrip("/")).name,
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
    )
    with one_line_errors(parser):
        engine = Engine(make_provider(args), config).start()
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
    try:
        uvicorn.run(
            create_app(engine, api_key=args.api_key),
            host=args.host,
            port=args.port,
            log_level=args.log_level.lower(),
        )
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
