"""`mlx-dflash generate | serve | bench | train`: each subcommand lives in its own module."""

import importlib
import sys

COMMANDS = {
    "generate": ("mlx_dflash.generate", "generate text with speculative decoding"),
    "serve": ("mlx_dflash.serve", "OpenAI- and Anthropic-compatible HTTP server"),
    "bench": (
        "mlx_dflash.bench.cli",
        "benchmark against stock mlx_lm (speedup, tau, efficiency)",
    ),
    "train": ("mlx_dflash.train.cli", "distil a DFlash drafter for any mlx_lm model"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: mlx-dflash {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:10s} {help_}")
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            sys.exit(2)
        return
    module = importlib.import_module(COMMANDS[argv[0]][0])
    module.main(argv[1:])


if __name__ == "__main__":
    main()
