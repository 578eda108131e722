"""Quantized drafts: their Linear layers are quantized; the output stays the
target's."""

import json

import mlx.core as mx
import mlx.nn as nn
import pytest
from helpers import run_cli
from mlx_lm.generate import generate_step as stock_generate_step
from models import tiny_model

from mlx_dflash.decode import generate_step
from mlx_dflash.load import make_drafter, quantize_draft
from mlx_dflash.target import Target


def stock(model, prompt, n):
    out = stock_generate_step(mx.array(prompt), model, max_tokens=n)
    return [t for t, _ in out]


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


def test_generate_reports_draft_dtype_and_quantization(model_dir, draft_dir):
    proc = run_cli(
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
