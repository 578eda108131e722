"""Which device we run on, and the drafter dtype that is safe and fast there.

Apple M1/M2 GPUs have no native bf16 (it is emulated, slowly) and fp16 drafts
can overflow to NaN logits, which silently gives 0% acceptance; MLX's CPU
backend has no fast bf16/fp16 matmul. So the drafter runs in fp32 on those and
in bf16 where the hardware has it (Apple M3 and later, NVIDIA compute
capability 8.0 and later). The policy functions take the device-info dict as an
argument, so they can be tested with any device faked.
"""

import re
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

# Metal GPU families in `device_info()["architecture"]` (applegpu_g13s, ...).
APPLE_GPU_GENERATION = {13: 1, 14: 2, 15: 3, 16: 4, 17: 5}


def backend() -> str:
    """ "metal", "cuda" or "cpu": where the default device runs."""
    if mx.default_device() == mx.cpu:
        return "cpu"
    if mx.metal.is_available():
        return "metal"
    if mx.cuda.is_available():
        return "cuda"
    return "cpu"


def device_info() -> dict:
    """`mx.device_info()` of the default device, plain values only."""
    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001 - older MLX or an unusual backend
        return {}
    return {k: v for k, v in info.items() if isinstance(v, (int, float, str))}


def apple_chip(info: dict) -> Optional[int]:
    """Apple M-series generation (1 for M1, ...) from a Metal device-info dict."""
    m = re.search(r"applegpu_g(\d+)", str(info.get("architecture", "")))
    if m and int(m.group(1)) in APPLE_GPU_GENERATION:
        return APPLE_GPU_GENERATION[int(m.group(1))]
    m = re.search(r"\bM(\d+)\b", str(info.get("device_name", "")))
    return int(m.group(1)) if m else None


def native_bf16(info: dict, backend: str) -> bool:
    if backend == "metal":
        chip = apple_chip(info)
        return chip is None or chip >= 3  # unknown: a newer chip than we list
    if backend == "cuda":
        major = info.get("compute_capability_major")
        return major is None or int(major) >= 8
    return False  # MLX's CPU bf16 matmul is ~5 GFLOP/s (DESIGN §4)


@dataclass
class DraftDtype:
    dtype: mx.Dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("mlx.core.")


def draft_dtype(
    info: dict, backend: str, *, requested: Optional[mx.Dtype] = None
) -> DraftDtype:
    """The dtype the drafter's weights and activations run in.

    Args:
        info: `mx.device_info()` of the device (or a faked one).
        backend: "metal", "cuda" or "cpu".
        requested: `--dtype`, which always wins.
    """
    if requested is not None:
        return DraftDtype(requested, "requested with --dtype")
    if backend == "cpu":
        return DraftDtype(mx.float32, "CPU backend: bf16/fp16 matmuls are slow")
    if not native_bf16(info, backend):
        what = (
            f"Apple M{apple_chip(info)}"
            if backend == "metal"
            else f"compute capability {info.get('compute_capability_major')}.x"
        )
        return DraftDtype(
            mx.float32,
            f"{what} has no native bf16 (emulated; fp16 drafts risk NaN logits)",
        )
    return DraftDtype(mx.bfloat16, f"{describe(info, backend)} has native bf16")


def describe(info: dict, backend: str) -> str:
    name = info.get("device_name") or backend
    return f"{name} ({backend})"


def traps(info: dict, backend: str, *, dtype: Optional[mx.Dtype] = None) -> list:
    """Known pitfalls for this device (and a `--dtype` choice), one line each."""
    out = []
    dtype = None if dtype is None else str(dtype).removeprefix("mlx.core.")
    if backend == "metal" and not native_bf16(info, backend):
        out.append(
            f"Apple M{apple_chip(info)}: bf16 is emulated (slow); the drafter runs "
            "in fp32 automatically, avoid --dtype bfloat16 for it"
        )
    if dtype == "float16":
        out.append(
            "--dtype float16: fp16 drafts can overflow to NaN logits and 0% "
            "acceptance; prefer float32 (or bfloat16 on chips that have it)"
        )
    if backend == "metal" and dtype == "bfloat16" and not native_bf16(info, backend):
        out.append("--dtype bfloat16 on this chip: emulated bf16, slow and NaN-prone")
    return out
