"""`mlx-dflash generate | serve | bench | train | doctor`: each subcommand lives in its own module."""

import ctypes
import importlib
import sys

COMMANDS = {
    "generate": ("mlx_dflash.generate", "generate text with speculative decoding"),
    "serve": ("mlx_dflash.server.cli", "OpenAI- and Anthropic-compatible HTTP server"),
    "bench": (
        "mlx_dflash.bench.cli",
        "benchmark against stock mlx_lm (speedup, tau, efficiency)",
    ),
    "train": ("mlx_dflash.train.cli", "distil a DFlash drafter for any mlx_lm model"),
    "doctor": (
        "mlx_dflash.doctor",
        "check MLX, device, BLAS, default pair, drafter for --model, known traps",
    ),
}
BLAS_CHOICES = ("auto", "openblas", "default")


def pop_blas(argv):
    """Take the global `--blas {auto,openblas,default}` option out of argv."""
    choice, rest, i = "auto", [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--blas" and i + 1 < len(argv):
            choice, i = argv[i + 1], i + 2
            continue
        if a.startswith("--blas="):
            choice = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    if choice not in BLAS_CHOICES:
        raise SystemExit(f"error: --blas must be one of {', '.join(BLAS_CHOICES)}")
    return choice, rest


def use_blas(choice: str) -> bool:
    """On Linux, load OpenBLAS process-wide before mlx is imported.

    MLX's Linux wheels bundle reference BLAS (~4 GFLOP/s fp32); symbols of a
    library loaded first with RTLD_GLOBAL take precedence, and OpenBLAS
    (Debian `libopenblas0-pthread`) runs the same matmuls at 30-90 GFLOP/s.
    "auto" loads it when present, "openblas" requires it, "default" never.
    """
    if choice == "default" or not sys.platform.startswith("linux"):
        return False
    if "mlx.core" in sys.modules:  # too late: MLX already bound its BLAS
        return False
    try:
        ctypes.CDLL("libopenblas.so.0", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        if choice == "openblas":
            raise SystemExit(
                "error: --blas openblas: libopenblas.so.0 not found "
                "(apt install libopenblas0-pthread)"
            )
        return False
    return True


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    blas, argv = pop_blas(argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(
            "usage: mlx-dflash [--blas auto|openblas|default] {"
            + ",".join(COMMANDS)
            + "} [options]\n"
        )
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:10s} {help_}")
        print(
            "\n  --blas     Linux: load OpenBLAS for MLX's CPU matmuls when installed "
            "(auto, the default), require it (openblas) or keep MLX's bundled one "
            "(default)"
        )
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
            sys.exit(2)
        return
    use_blas(blas)
    module = importlib.import_module(COMMANDS[argv[0]][0])
    module.main(argv[1:])


if __name__ == "__main__":
    main()
