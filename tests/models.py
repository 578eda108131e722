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


# Families some tests need but the shared parametrised ones do not run over.
EXTRA_CONFIGS = {
    "qwen3_moe": dict(
        BASE,
        model_type="qwen3_moe",
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
}


def tiny_model(family: str, seed: int = 0) -> nn.Module:
    config = CONFIGS[family] if family in CONFIGS else EXTRA_CONFIGS[family]
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Larger-than-default weights give peaked, varied greedy outputs.
    params = tree_map(lambda p: p * 3.0 if p.ndim == 2 else p, model.parameters())
    model.update(params)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    model.eval()  # inference mode, as mlx_lm.load leaves a model
    return model


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer_files(path, vocab_size: int = VOCAB):
    """A word-level tokenizer over `vocab_size` ids: specials, a-z, digits, words."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [
        str(d) for d in range(10)
    ]
    words += ["user", "assistant", "system", "\n", "hello", "world", "def", "return"]
    words += [f"w{i}" for i in range(vocab_size - len(specials) - len(words) - 1)]
    vocab = {t: i for i, t in enumerate(specials + words + ["<unk>"])}
    assert len(vocab) == vocab_size
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(specials)
    tok.save(str(path / "tokenizer.json"))
    with open(path / "tokenizer_config.json", "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "chat_template": CHAT_TEMPLATE,
            },
            f,
        )


def save_tiny_model_dir(family: str, path, seed: int = 0):
    """An mlx_lm model directory (weights, config, tokenizer) of a tiny model."""
    from pathlib import Path

    from mlx_lm.utils import save_config, save_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = tiny_model(family, seed)
    save_model(path, model)
    save_config(dict(CONFIGS[family]), path / "config.json")
    tiny_tokenizer_files(path)
    return model


def save_tiny_shape_draft(path) -> str:
    """A 1-layer random DFlash checkpoint for the bench's `tiny-qwen3` shape."""
    from mlx_dflash.draft import DFlashDraft, DraftArgs, save_draft

    mx.random.seed(0)
    args = DraftArgs(
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-6,
        vocab_size=1024,
        target_layer_ids=[1, 2],
        mask_token_id=1000,
    )
    save_draft(DFlashDraft(args), str(path))
    return str(path)


def kernel_model(family: str = "qwen3"):
    """A 2-layer bf16 llama or qwen3 model of shapes the CUDA kernels take
    (hidden 512, MLP 1024, 4 query / 2 KV heads of 128, vocab 1024); "qwen3_5":
    4 layers (3 GatedDeltaNet: 4 key heads of 128, 16 value heads of 32)."""
    if family == "qwen3_5":
        config = dict(
            CONFIGS["qwen3_5"],
            text_config=dict(
                CONFIGS["qwen3_5"]["text_config"],
                hidden_size=512,
                intermediate_size=1024,
                head_dim=128,
                linear_num_key_heads=4,
                linear_key_head_dim=128,
                linear_num_value_heads=16,
                linear_value_head_dim=32,
                rms_norm_eps=1e-6,
                vocab_size=1024,
            ),
        )
        model_cls, args_cls = _get_classes(config)
        model = model_cls(args_cls.from_dict(config))
        model.set_dtype(mx.bfloat16)
        model.eval()
        return model
    from mlx_lm.models import llama, qwen3

    cls = {"qwen3": qwen3, "llama": llama}[family]
    args = cls.ModelArgs(
        model_type=family,
        hidden_size=512,
        num_hidden_layers=2,
        intermediate_size=1024,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        rms_norm_eps=1e-6,
        vocab_size=1024,
        max_position_embeddings=4096,
        rope_theta=1e6,
        tie_word_embeddings=True,
    )
    model = cls.Model(args)
    model.set_dtype(mx.bfloat16)
    model.eval()
    return model
