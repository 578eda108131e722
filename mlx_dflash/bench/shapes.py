"""Random-weight targets and drafts of real model shapes, built in the target dtype.

Timing does not depend on weight values, so anyone can reproduce GPU numbers
without downloading weights. Parameters are created lazily, cast, and then
evaluated one layer at a time, so no full fp32 copy ever exists.
"""

from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import _get_classes

from ..device import backend, device_info
from ..draft import DFlashDraft, DraftArgs, default_target_layer_ids
from ..memory import available_memory, gb

QWEN3_8B = dict(
    model_type="qwen3",
    hidden_size=4096,
    num_hidden_layers=36,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    tie_word_embeddings=False,
)

QWEN3_5_9B = dict(
    model_type="qwen3_5",
    text_config=dict(
        model_type="qwen3_5_text",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=12288,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        rms_norm_eps=1e-6,
        vocab_size=248320,
        max_position_embeddings=262144,
        linear_num_value_heads=32,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        tie_word_embeddings=False,
        rope_parameters=dict(
            type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25
        ),
    ),
)

# Qwen3.6-27B (the seeds' 4-bit target; Qwen3.5-27B has the same shape):
# 64 layers, every fourth full attention with an output gate, the rest
# GatedDeltaNet with 48 value heads over 16 key heads.
QWEN3_6_27B = dict(
    model_type="qwen3_5",
    text_config=dict(
        QWEN3_5_9B["text_config"],
        hidden_size=5120,
        num_hidden_layers=64,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        linear_num_value_heads=48,
    ),
)

# The default target's shape (SmolLM2-135M, llama), to time the default pair
# where its GGUF file cannot travel.
SMOLLM2_135M = dict(
    model_type="llama",
    hidden_size=576,
    num_hidden_layers=30,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)

# Small shapes for CPU checks of the whole path (same families, same code).
TINY_QWEN3 = dict(
    QWEN3_8B,
    hidden_size=128,
    num_hidden_layers=4,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=1024,
)
TINY_QWEN3_5 = dict(
    model_type="qwen3_5",
    text_config=dict(
        QWEN3_5_9B["text_config"],
        hidden_size=128,
        num_hidden_layers=4,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1024,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    ),
)

# name -> (target config, draft head layout, mask token id). The 27B's draft
# has the layout and mask id of z-lab's DFlash2 drafter for the same-shaped
# Qwen3.8-27B (32 heads over 8, head size 128, id 248070), at the target's width.
PRESETS = {
    "qwen3-8b": (QWEN3_8B, dict(heads=32, kv_heads=8, head_dim=128), 151669),
    "qwen3.5-9b": (QWEN3_5_9B, dict(heads=32, kv_heads=8, head_dim=128), 248070),
    "qwen3.6-27b": (QWEN3_6_27B, dict(heads=32, kv_heads=8, head_dim=128), 248070),
    "smollm2-135m": (SMOLLM2_135M, dict(heads=9, kv_heads=3, head_dim=64), 0),
    "tiny-qwen3": (TINY_QWEN3, dict(heads=4, kv_heads=2, head_dim=32), 1000),
    "tiny-qwen3.5": (TINY_QWEN3_5, dict(heads=4, kv_heads=2, head_dim=32), 1000),
}


def _text(config: dict) -> dict:
    return config.get("text_config", config)


def _eval_by_layer(model: nn.Module, layers) -> None:
    for layer in layers:
        mx.eval(layer.parameters())
    mx.eval(model.parameters())


def lazy_target(preset: str, dtype=mx.bfloat16) -> nn.Module:
    """The mlx_lm model of a named shape in `dtype`, its random weights drawn
    (from the current seed) but not yet made: nothing is materialised."""
    if preset not in PRESETS:
        raise ValueError(
            f"unknown shape preset {preset!r}; choose from {sorted(PRESETS)}"
        )
    config = PRESETS[preset][0]
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    model.set_dtype(dtype)  # lazy: nothing is materialised in fp32 as a whole
    return model


def build_target(
    preset: str,
    *,
    dtype=mx.bfloat16,
    seed: int = 0,
    peaked: bool = False,
    quantize: Optional[int] = None,
    group_size: int = 64,
) -> nn.Module:
    """A random-weight mlx_lm model of a named shape, in `dtype`; with
    `quantize` (4 or 8 bits), affine-quantized as `mlx_lm.convert -q` leaves
    a model (`mlx.nn.quantize`: every Linear and Embedding whose input width
    `group_size` divides), a layer at a time.

    `peaked` conditions the random weights so that every greedy choice wins by
    a wide margin (same shapes, same cost): plain random weights give
    near-flat logits whose top two differ by less than bf16 rounding, so a
    16-row verify and a 1-row decode step (different matmul kernels) pick
    different tokens within a few steps and token equality says nothing about
    the decoder. Here the embedding is scaled to unit entries, every residual
    branch's output projection by 0.05, and the (untied) head holds permuted
    embedding rows: the next token is a fixed function of the current one,
    lightly perturbed by the context.
    """
    mx.random.seed(seed)
    model = lazy_target(preset, dtype)
    bits = f" at {quantize} bits" if quantize else ""
    check_fits(f"--shape {preset}{bits}", weight_bytes(model, quantize, group_size))
    # Inference mode, as mlx_lm.load leaves a model: GatedDeltaNet layers check
    # `training` to pick their fused kernel over the differentiable ops path.
    model.eval()
    lm = model["language_model"] if "language_model" in model else model
    if peaked:
        _peak(lm, seed)
    if quantize is None:
        _eval_by_layer(model, lm.model.layers)
        return model
    # Each layer made and quantized before the next, so the full-precision
    # model never exists whole (the 27B shape's would take 54 GB); the same
    # values as quantizing the evaluated model, since the random draws are
    # fixed when the modules are built.
    for layer in lm.model.layers:
        nn.quantize(layer, group_size=group_size, bits=quantize)
        mx.eval(layer.parameters())
    nn.quantize(model, group_size=group_size, bits=quantize)  # embedding, head
    mx.eval(model.parameters())
    return model


def check_fits(what: str, need: int) -> None:
    """Refuse, before allocating, weights of `need` bytes that the device
    cannot hold: running out of memory on Apple silicon aborts the process
    rather than raising."""
    free = available_memory(device_info(), backend())
    if free is not None and need > free:
        raise ValueError(
            f"{what}: its weights alone take ~{gb(need)} and {gb(free)} is "
            f"available on this {backend()} device"
        )


def weight_bytes(
    model: nn.Module, quantize: Optional[int] = None, group_size: int = 64
) -> int:
    """Bytes `model`'s parameters take once built, from their shapes alone
    (nothing evaluated); with `quantize` bits, its Linear and Embedding
    weights as `mlx.nn.quantize` leaves them (packed, plus a scale and a bias
    per group in the model's dtype)."""
    total = 0
    for _, m in model.named_modules():
        for name, v in m.items():
            if not isinstance(v, mx.array):
                continue
            if quantize and name == "weight" and hasattr(m, "to_quantized"):
                groups = v.size // group_size
                total += v.size * quantize // 8 + 2 * groups * v.dtype.size
            else:
                total += v.nbytes
    return total


def _peak(lm: nn.Module, seed: int) -> None:
    emb = lm.model.embed_tokens
    d = emb.weight.shape[-1]
    emb.weight = emb.weight * (d**0.5)  # mlx init: std 1/sqrt(d)
    for layer in lm.model.layers:
        for name, m in layer.named_modules():
            if name.split(".")[-1] in ("o_proj", "out_proj", "down_proj"):
                m.weight = m.weight * 0.05
    if "lm_head" in lm:
        perm = mx.random.permutation(emb.weight.shape[0], key=mx.random.key(seed))
        lm.lm_head.weight = emb.weight[perm].astype(lm.lm_head.weight.dtype)


def build_draft(
    preset: str,
    num_target_layers: int,
    *,
    num_layers: int = 5,
    block_size: int = 16,
    dtype=mx.bfloat16,
    seed: int = 1,
) -> DFlashDraft:
    """A random-weight DFlash draft of the intended shape for a preset's target."""
    config, heads, mask = PRESETS[preset]
    t = _text(config)
    args = DraftArgs(
        hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=heads["heads"],
        num_key_value_heads=heads["kv_heads"],
        head_dim=heads["head_dim"],
        rms_norm_eps=1e-6,
        vocab_size=t["vocab_size"],
        target_layer_ids=default_target_layer_ids(num_target_layers, num_layers),
        mask_token_id=mask,
        block_size=block_size,
        num_target_layers=num_target_layers,
    )
    return random_draft(args, dtype=dtype, seed=seed)


def random_draft(args: DraftArgs, *, dtype=mx.bfloat16, seed: int = 1) -> DFlashDraft:
    mx.random.seed(seed)
    draft = DFlashDraft(args)
    draft.set_dtype(dtype)
    check_fits(f"a {args.num_hidden_layers}-layer random draft", weight_bytes(draft))
    _eval_by_layer(draft, draft.layers)
    return draft


def draft_for_target(
    target_model: nn.Module,
    num_target_layers: int,
    *,
    num_layers: int = 1,
    block_size: int = 16,
    dtype: Optional[mx.Dtype] = None,
    mask_token_id: Optional[int] = None,
    seed: int = 1,
) -> DFlashDraft:
    """A random draft shaped after any loaded target (Qwen3-style layers, target width)."""
    lm = (
        target_model["language_model"]
        if "language_model" in target_model
        else target_model
    )
    args = lm.args if hasattr(lm, "args") else target_model.args
    hidden = args.hidden_size
    heads = args.num_attention_heads
    kv = getattr(args, "num_key_value_heads", None) or heads
    vocab = args.vocab_size
    draft_args = DraftArgs(
        hidden_size=hidden,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=getattr(args, "head_dim", None) or hidden // heads,
        rms_norm_eps=getattr(args, "rms_norm_eps", 1e-6),
        vocab_size=vocab,
        target_layer_ids=default_target_layer_ids(num_target_layers, num_layers),
        mask_token_id=vocab - 1 if mask_token_id is None else mask_token_id,
        block_size=block_size,
        num_target_layers=num_target_layers,
    )
    if dtype is None:
        dtype = mx.float32
    return random_draft(draft_args, dtype=dtype, seed=seed)
