"""The drafter dtype policy per chip and backend, and the traps doctor names."""

import mlx.core as mx
import pytest

from mlx_dflash import device

M1 = {"architecture": "applegpu_g13s", "device_name": "Apple M1 Max"}
M2 = {"architecture": "applegpu_g14g", "device_name": "Apple M2"}
M3 = {"architecture": "applegpu_g15s", "device_name": "Apple M3 Pro"}
M4_NAME_ONLY = {"device_name": "Apple M4"}
H200 = {"architecture": "sm_90", "compute_capability_major": 9, "device_name": "H200"}
T4 = {"architecture": "sm_75", "compute_capability_major": 7, "device_name": "T4"}


@pytest.mark.parametrize(
    "info, backend, dtype, reason",
    [
        (M1, "metal", mx.float32, "Apple M1 has no native bf16"),
        (M2, "metal", mx.float32, "Apple M2 has no native bf16"),
        (M3, "metal", mx.bfloat16, "native bf16"),
        (M4_NAME_ONLY, "metal", mx.bfloat16, "native bf16"),
        (H200, "cuda", mx.bfloat16, "native bf16"),
        (T4, "cuda", mx.float32, "compute capability 7.x has no native bf16"),
        ({"device_name": "AMD EPYC"}, "cpu", mx.float32, "CPU backend"),
    ],
)
def test_draft_dtype_policy(info, backend, dtype, reason):
    policy = device.draft_dtype(info, backend)
    assert policy.dtype == dtype
    assert reason in policy.reason


def test_requested_dtype_wins_and_traps_are_named():
    policy = device.draft_dtype(M1, "metal", requested=mx.float16)
    assert policy.dtype == mx.float16 and "requested" in policy.reason
    assert device.apple_chip(M1) == 1 and device.apple_chip(M3) == 3
    assert any("bf16 is emulated" in t for t in device.traps(M1, "metal"))
    assert not device.traps(M3, "metal")
    assert any("NaN" in t for t in device.traps(M3, "metal", dtype=mx.float16))
