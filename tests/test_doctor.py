"""`mlx-dflash doctor` and the global --blas option."""

import json
import sys

import mlx.core as mx
import pytest
from helpers import run_cli

from mlx_dflash import device, doctor
from mlx_dflash.cli import pop_blas


def test_doctor_report():
    r = doctor.collect("mlx-community/Qwen3-8B-4bit", measure_blas=False)
    assert r["backend"] == device.backend()
    assert r["model"]["draft"] == "z-lab/Qwen3-8B-DFlash-b16"
    assert r["draft_dtype"] == device.draft_dtype(r["device"], r["backend"]).name
    assert r["default_pair"]["draft"] is not None
    text = doctor.format_text(r)
    assert "z-lab/Qwen3-8B-DFlash-b16" in text and "backend:" in text
    unknown = doctor.collect("org/Unknown-7B", dtype=mx.float16, measure_blas=False)
    assert unknown["model"]["draft"] is None
    assert any("NaN" in t for t in unknown["traps"])


def test_doctor_json_cli():
    proc = run_cli("doctor", "--json", "--model", "Qwen/Qwen3.5-9B")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["model"]["draft"] == "z-lab/Qwen3.5-9B-DFlash"
    if sys.platform.startswith("linux") and r["backend"] == "cpu":
        assert r["blas"]["gflops_fp32_1024"] > 0


def test_blas_option_is_global_and_checked():
    assert pop_blas(["generate", "-p", "x"]) == ("auto", ["generate", "-p", "x"])
    assert pop_blas(["--blas", "default", "doctor"]) == ("default", ["doctor"])
    assert pop_blas(["doctor", "--blas=openblas"]) == ("openblas", ["doctor"])
    with pytest.raises(SystemExit):
        pop_blas(["--blas", "mkl", "doctor"])
