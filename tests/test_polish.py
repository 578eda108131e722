"""Quantized drafts, the per-chip dtype policy, the memory guard, doctor and --blas."""

import json
import subprocess
import sys

import httpx
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import ArraysCache, KVCache
from models import VOCAB, save_tiny_model_dir, tiny_model
from test_draft import write, zlab_config, zlab_weights

from mlx_dflash import device, doctor
from mlx_dflash.cli import pop_blas
from mlx_dflash.decode import generate_step
from mlx_dflash.load import make_drafter, quantize_draft
from mlx_dflash.memory import (
    available_memory,
    check_memory,
    meminfo_available,
    memory_model,
)
from mlx_dflash.target import Target


def stock(model, prompt, n):
    out = stock_generate_step(mx.array(prompt), model, max_tokens=n)
    return [t for t, _ in out]


@pytest.fixture
def draft_dir(tmp_path):
    return str(write(tmp_path / "draft", zlab_config(), zlab_weights()))


# ---- quantized drafts ---------------------------------------------------------------


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_draft_is_quantized_and_lossless(draft_dir, bits):
    model = tiny_model("qwen3")
    target = Target(model)
    drafter, block = make_drafter(draft_dir, target, dtype=mx.float32, quantize=bits)
    layer = drafter.draft.layers[0]
    for lin in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.gate_proj):
        assert isinstance(lin, nn.QuantizedLinear) and lin.bits == bits
        assert lin.group_size == 64
    # Input width 96 is not a multiple of 64; fc keeps the activation dtype.
    assert type(layer.mlp.down_proj) is nn.Linear
    assert type(drafter.draft.fc) is nn.Linear
    assert drafter.draft.dtype == mx.float32

    prompt = list(range(3, 30))
    ours = [t for t, _ in generate_step(target, prompt, drafter, max_tokens=40)]
    assert ours == stock(model, prompt, 40)


def test_quantize_rejects_other_bits(draft_dir):
    drafter, _ = make_drafter(draft_dir, Target(tiny_model("qwen3")))
    with pytest.raises(ValueError, match="must be 4 or 8"):
        quantize_draft(drafter.draft, 3)


# ---- dtype policy per chip ----------------------------------------------------------

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


# ---- memory guard -------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_estimate_matches_real_cache_bytes(draft_dir, family):
    target = Target(tiny_model(family))
    drafter, _ = make_drafter(draft_dir, target, dtype=mx.float32)
    prompt = [3 + (i * 7) % (VOCAB - 4) for i in range(300)]
    max_tokens, block = 40, 16
    cache = target.make_cache(bucket=False)
    for _ in generate_step(
        target, prompt, drafter, cache=cache, max_tokens=max_tokens, block_size=block
    ):
        pass
    mx.eval([c.state for c in cache])
    est = memory_model(target, drafter).estimate(
        len(prompt), max_tokens, block_size=block
    )
    kv = sum(c.nbytes for c in cache if isinstance(c, KVCache))
    gdn = sum(c.nbytes for c in cache if isinstance(c, ArraysCache))
    draft_kv = sum(c.nbytes for c in drafter.cache)
    # Caches grow in 256-token steps: allow one step per layer.
    per_token = memory_model(target, drafter)
    assert abs(est.target_kv - kv) <= 256 * per_token.kv_per_token
    assert abs(est.draft_kv - draft_kv) <= 256 * per_token.draft_kv_per_token
    assert kv > 0 and draft_kv > 0
    assert est.gdn_state == gdn
    assert (gdn > 0) == (family == "qwen3_5")


def test_refuses_what_does_not_fit(draft_dir):
    target = Target(tiny_model("qwen3"))
    drafter, _ = make_drafter(draft_dir, target)
    est = memory_model(target, drafter).estimate(100_000, 100_000)
    check_memory(est, None)  # unknown budget: no refusal
    check_memory(est, est.new)
    with pytest.raises(ValueError) as err:
        check_memory(est, est.new - 1)
    assert "not enough memory for 200016 tokens" in str(err.value)
    assert "\n" not in str(err.value)


def test_available_memory_sources():
    text = "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable:     512 kB\n"
    assert meminfo_available(text) == 512 * 1024
    active = mx.get_active_memory()
    metal = {"max_recommended_working_set_size": active + 5000}
    assert available_memory(metal, "metal") == 5000
    assert available_memory({"total_memory": active + 7}, "cuda") == 7
    assert available_memory({}, "cpu", limit=active + 3) <= 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    save_tiny_model_dir("qwen3", path)
    return path


def cli(*args):
    cmd = [sys.executable, "-m", "mlx_dflash.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_generate_refuses_before_allocating(model_dir):
    proc = cli(
        "generate",
        *("--model", str(model_dir), "--draft", "lookup", "--prompt", "hello"),
        *("--max-tokens", "100000", "--max-memory-gb", "0.001"),
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("error: not enough memory for") and "\n" not in line


def test_generate_reports_draft_dtype_and_quantization(model_dir, draft_dir):
    proc = cli(
        "generate",
        *("--model", str(model_dir), "--draft", draft_dir, "--prompt", "hello"),
        *("--max-tokens", "12", "--draft-quantize", "8", "--json", "--verbose"),
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["draft_dtype"] == "float32"  # CPU backend
    assert "CPU" in result["draft_dtype_reason"]
    assert result["draft_quantize"] == 8
    assert "drafter dtype float32" in proc.stderr and "memory:" in proc.stderr


def test_serve_answers_400_when_memory_would_run_out():
    from test_server import LiveServer, random_provider

    server = LiveServer(random_provider("qwen3"), max_memory=1)
    try:
        server.engine.config.max_memory = mx.get_active_memory() + (64 << 20)
        # A window that holds the max_tokens below: only memory can refuse it.
        server.engine.config.max_context = 100_000_000
        ok = server.openai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert ok.choices[0].message.content is not None
        r = server.openai.chat.completions.with_raw_response
        with pytest.raises(Exception) as err:
            r.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=10_000_000,
            )
        assert err.value.status_code == 400
        assert err.value.body["code"] == "insufficient_memory"
        assert "not enough memory" in err.value.body["message"]
        # The Anthropic SDK itself refuses such a max_tokens; post directly.
        reply = httpx.post(
            server.url + "/v1/messages",
            json={
                "model": "claude-x",
                "max_tokens": 10_000_000,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert reply.status_code == 400
        assert reply.json()["type"] == "error"
        assert "not enough memory" in reply.json()["error"]["message"]
    finally:
        server.close()


# ---- doctor and --blas --------------------------------------------------------------


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
    proc = cli("doctor", "--json", "--model", "Qwen/Qwen3.5-9B")
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
