"""Drafter auto-resolution: target names (and their quantized variants) -> z-lab repos."""

import subprocess
import sys

import pytest

from mlx_dflash.registry import DRAFTERS, draft_for, normalize, resolve_draft

CASES = {
    "Qwen/Qwen3-8B": "z-lab/Qwen3-8B-DFlash-b16",
    "mlx-community/Qwen3-8B-4bit": "z-lab/Qwen3-8B-DFlash-b16",
    "mlx-community/Qwen3-4B-bf16": "z-lab/Qwen3-4B-DFlash-b16",
    "Qwen/Qwen3.5-4B": "z-lab/Qwen3.5-4B-DFlash",
    "mlx-community/Qwen3.5-9B-MLX-8bit": "z-lab/Qwen3.5-9B-DFlash",
    "mlx-community/Qwen3.5-27B-4bit-DWQ": "z-lab/Qwen3.5-27B-DFlash",
    "mlx-community/Qwen3.5-35B-A3B-8bit": "z-lab/Qwen3.5-35B-A3B-DFlash",
    "Qwen/Qwen3.6-27B": "z-lab/Qwen3.6-27B-DFlash",
    "unsloth/Qwen3.6-35B-A3B-GGUF": "z-lab/Qwen3.6-35B-A3B-DFlash",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "meta-llama/Llama-3.1-8B-Instruct": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "openai/gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
    "mlx-community/gpt-oss-120b-MXFP4-Q8": "z-lab/gpt-oss-120b-DFlash",
    "/models/Qwen3-8B-Q4_K_M.gguf": "z-lab/Qwen3-8B-DFlash-b16",
    "~/.cache/huggingface/hub/models--mlx-community--Qwen3-4B-4bit/snapshots/abc": (
        "z-lab/Qwen3-4B-DFlash-b16"
    ),
    "./my-models/qwen3-8b-mlx-bf16/": "z-lab/Qwen3-8B-DFlash-b16",
}


@pytest.mark.parametrize("model", list(CASES))
def test_resolves_targets_and_quantized_variants(model):
    assert resolve_draft(model) == CASES[model]


@pytest.mark.parametrize(
    "model",
    [
        "Qwen/Qwen3-14B",  # no published drafter
        "Qwen/Qwen3-4B-Instruct-2507",  # a different model than Qwen3-4B
        "meta-llama/Llama-3.1-8B",  # base, not the instruct model
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ],
)
def test_unknown_targets_do_not_resolve(model):
    assert resolve_draft(model) is None


def test_every_entry_is_a_zlab_repo_and_keys_are_normal():
    for key, repo in DRAFTERS.items():
        assert repo.startswith("z-lab/")
        assert normalize(key) == key


def test_no_drafter_is_one_line_error():
    with pytest.raises(ValueError) as err:
        draft_for("Qwen/Qwen3-14B")
    msg = str(err.value)
    assert "\n" not in msg
    assert "--draft" in msg and "mlx-dflash train" in msg


def test_generate_without_draft_for_unknown_model_says_how(tmp_path):
    from models import save_tiny_model_dir

    path = tmp_path / "tiny-unknown-model"
    save_tiny_model_dir("qwen3", path)
    cmd = [sys.executable, "-m", "mlx_dflash.cli", "generate"]
    cmd += ["--model", str(path), "--prompt", "hi"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("error: no published DFlash drafter is known for")
    assert "\n" not in line and "mlx-dflash train" in line


def test_serve_without_draft_for_unknown_model_says_how():
    cmd = [sys.executable, "-m", "mlx_dflash.cli", "serve", "--model", "org/Unknown-7B"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no published DFlash drafter" in proc.stderr
