"""Tiny random fp32 models of several mlx_lm families, built from their ModelArgs."""

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.utils import _get_classes

VOCAB = 96

BASE = dict(
    hidden_size=64,
    num_hidden_layers=4,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)

CONFIGS = {
    "llama": dict(BASE, model_type="llama", tie_word_embeddings=True),
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=False),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=16, tie_word_embeddings=False),
    # Hybrid: 3 GatedDeltaNet layers + 1 attention layer, Hv (4) != Hk (2).
    "qwen3_5": dict(
        model_type="qwen3_5",
        text_config=dict(
            BASE,
            model_type="qwen3_5_text",
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            full_attention_interval=4,
            tie_word_embeddings=False,
            rope_parameters=dict(
                type="default", rope_theta=10000.0, partial_rotary_factor=0.25
            ),
        ),
    ),
    "qwen3_5_moe": dict(
        model_type="qwen3_5_moe",
        text_config=dict(
            BASE,
            model_type="qwen3_5_moe_text",
            head_dim=16,
            linear_num_value_heads=4,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            full_attention_interval=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            tie_word_embeddings=True,
            rope_parameters=dict(
                type="default", rope_theta=10000.0, partial_rotary_factor=0.25
            ),
        ),
    ),
}


def tiny_model(family: str, seed: int = 0) -> nn.Module:
    config = CONFIGS[family]
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Larger-than-default weights give peaked, varied greedy outputs.
    params = tree_map(lambda p: p * 3.0 if p.ndim == 2 else p, model.parameters())
    model.update(params)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model
