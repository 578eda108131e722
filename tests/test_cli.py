"""`mlx-dflash generate --json` end to end on a local model directory."""

import json
import subprocess
import sys

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step as stock_generate_step
from helpers import write, zlab_config, zlab_weights


def generate(*args):
    cmd = [sys.executable, "-m", "mlx_dflash.cli", "generate", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc


def stock_tokens(model_dir, prompt, n):
    model, tok = load(str(model_dir))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    out = []
    for t, _ in stock_generate_step(mx.array(ids), model, max_tokens=n):
        if t in tok.eos_token_ids:
            break
        out.append(t)
    return out


@pytest.mark.parametrize("draft", ["lookup", "dflash", "none"])
def test_generate_json(model_dir, tmp_path, draft):
    if draft == "dflash":
        draft = str(write(tmp_path / "draft", zlab_config(), zlab_weights()))
    proc = generate(
        "--model",
        str(model_dir),
        "--draft",
        draft,
        "--prompt",
        "hello world",
        "--max-tokens",
        "30",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["tokens"] == stock_tokens(model_dir, "hello world", 30)
    assert result["stats"]["block_size"] == (1 if draft == "none" else 16)
    assert {
        "text",
        "finish_reason",
        "generation_tps",
        "prompt_tps",
        "peak_memory_gb",
    } <= set(result)


def test_bad_draft_is_one_line_error(model_dir, tmp_path):
    bad = write(tmp_path / "bad", zlab_config(hidden_size=32), zlab_weights())
    proc = generate("--model", str(model_dir), "--draft", str(bad), "--prompt", "hi")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: draft hidden_size 32 != target hidden size 64"
