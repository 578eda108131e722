"""The DFlash draft model, its config, and load/save in the z-lab format.

A few Qwen3-style layers with no embedding and no head of their own. Context
features (target layer outputs, concatenated) go through `fc` + `hidden_norm`
and then through every layer's own k/v projections; those context K/V are the
only thing cached. A block `[anchor, MASK x (B-1)]` attends to the cached
context and to itself (bidirectionally; causal + windowed on sliding layers),
so the draft never rolls back: it only appends committed context.
"""

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.activations import silu
from mlx_lm.models.cache import KVCache
from mlx_lm.models.rope_utils import initialize_rope

from .cache import BucketKVCache
from .kernels.attention import block_attention
from .starts import start_eval

# The verify block of z-lab's drafters and ours; a config without one has it,
# and so does a drafter without a preference (`load.block_size_for`).
DEFAULT_BLOCK_SIZE = 16

REQUIRED_CONFIG = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "vocab_size",
)


@dataclass
class DraftArgs:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    vocab_size: int
    target_layer_ids: List[int]
    mask_token_id: int
    block_size: int = DEFAULT_BLOCK_SIZE
    num_target_layers: Optional[int] = None
    head_dim: Optional[int] = None
    rope_theta: float = 1_000_000.0
    rope_scaling: Optional[Dict[str, Any]] = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    layer_types: Optional[List[str]] = None
    sliding_window: Optional[int] = None
    is_causal: Optional[bool] = None

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.layer_types is None:
            self.layer_types = ["full_attention"] * self.num_hidden_layers

    @classmethod
    def from_config(cls, config: dict) -> "DraftArgs":
        """Read a z-lab `config.json` dict; raise ValueError naming what is wrong."""
        for key in REQUIRED_CONFIG:
            if key not in config:
                raise ValueError(f"draft config.json is missing '{key}'")
        dflash = config.get("dflash_config") or {}
        mask = dflash.get("mask_token_id", config.get("mask_token_id"))
        if mask is None:
            raise ValueError("draft config.json has no dflash_config.mask_token_id")
        ids = dflash.get("target_layer_ids", config.get("target_layer_ids"))
        if not ids:
            raise ValueError("draft config.json has no dflash_config.target_layer_ids")
        rope_theta = config.get("rope_theta")
        if rope_theta is None:
            rope_theta = (config.get("rope_parameters") or {}).get("rope_theta", 1e6)
        layer_types = config.get("layer_types")
        if layer_types is not None and len(layer_types) != config["num_hidden_layers"]:
            raise ValueError(
                f"draft config.json has {len(layer_types)} layer_types for "
                f"{config['num_hidden_layers']} layers"
            )
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            rms_norm_eps=config["rms_norm_eps"],
            vocab_size=config["vocab_size"],
            target_layer_ids=[int(i) for i in ids],
            mask_token_id=int(mask),
            block_size=int(
                config.get("block_size", dflash.get("block_size", DEFAULT_BLOCK_SIZE))
            ),
            num_target_layers=config.get("num_target_layers"),
            head_dim=config.get("head_dim"),
            rope_theta=float(rope_theta),
            rope_scaling=config.get("rope_scaling"),
            max_position_embeddings=config.get("max_position_embeddings", 40960),
            attention_bias=config.get("attention_bias", False),
            layer_types=layer_types,
            sliding_window=config.get("sliding_window"),
            is_causal=dflash.get("is_causal", config.get("is_causal")),
        )

    def to_config(self) -> dict:
        """The z-lab `config.json` (also read by vLLM and SGLang)."""
        c = asdict(self)
        c.pop("mask_token_id")
        c.pop("target_layer_ids")
        c.pop("is_causal")
        c.update(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            hidden_act="silu",
            tie_word_embeddings=False,
            use_sliding_window=self.sliding_window is not None,
            dflash_config={
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        )
        return c


def default_target_layer_ids(
    num_target_layers: int, num_draft_layers: int
) -> List[int]:
    """N ids spread evenly from 1 to L-3 (N=1: L//2), as z-lab's trainer picks them."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    step = (hi - lo) / (num_draft_layers - 1)
    return [int(round(lo + i * step)) for i in range(num_draft_layers)]


class DraftAttention(nn.Module):
    def __init__(self, args: DraftArgs, layer_idx: int):
        super().__init__()
        dim, hd = args.hidden_size, args.head_dim
        self.n_heads, self.n_kv_heads = (
            args.num_attention_heads,
            args.num_key_value_heads,
        )
        self.scale = hd**-0.5
        bias = args.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, dim, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=args.rms_norm_eps)
        self.rope = initialize_rope(
            hd,
            base=args.rope_theta,
            traditional=False,
            scaling_config=args.rope_scaling,
            max_position_embeddings=args.max_position_embeddings,
        )
        sliding = args.layer_types[layer_idx] == "sliding_attention"
        self.window = args.sliding_window if sliding else None
        # As in z-lab's reference: sliding layers are causal unless told otherwise.
        self.causal = sliding if args.is_causal is None else bool(args.is_causal)
        # From this many keys the block attends with plain ops
        # (kernels/attention.py); the drafter's block path sets it.
        self.from_keys = math.inf

    def kv(self, x: mx.array, offset):
        return self._kv_heads(self.k_proj(x), self.v_proj(x), offset)

    def _kv_heads(self, k: mx.array, v: mx.array, offset):
        B, L, _ = k.shape
        k = self.k_norm(k.reshape(B, L, self.n_kv_heads, -1))
        k = self.rope(k.transpose(0, 2, 1, 3), offset=offset)
        return k, v.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

    def append_context(self, ctx: mx.array, cache: KVCache):
        cache.update_and_fetch(*self.kv(ctx, cache.offset))

    def __call__(self, x: mx.array, cache) -> mx.array:
        out = self.attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), cache)
        return self.o_proj(out)

    def attend(self, q: mx.array, k: mx.array, v: mx.array, cache) -> mx.array:
        """The block's attention from its q/k/v projections (B, L, ·) to
        o_proj's input; `cache` a `BucketKVCache` or a `StackedContext`."""
        B, L, _ = q.shape
        start = cache.offset
        q = self.q_norm(q.reshape(B, L, self.n_heads, -1))
        q = self.rope(q.transpose(0, 2, 1, 3), offset=start)
        k, v = self._kv_heads(k, v, start)
        cap = 0
        if cache.keys is not None:
            # The whole bucketed buffer: the key length changes once per bucket.
            cap = cache.keys.shape[2]
            k = mx.concatenate([cache.keys, k], axis=2)
            v = mx.concatenate([cache.values, v], axis=2)
        if isinstance(cache, StackedContext):
            mask = cache.block_mask(L, causal=self.causal, window=self.window)
        else:
            mask = block_mask(L, start, cap, causal=self.causal, window=self.window)
        out = block_attention(q, k, v, self.scale, mask, self.from_keys)
        return out.transpose(0, 2, 1, 3).reshape(B, L, -1)


def block_mask(L: int, start: int, cap: int, *, causal: bool, window: Optional[int]):
    """Visibility of keys [context buffer (cap rows, `start` used), block] from the
    block's queries; None when everything is visible."""
    if cap == start and not causal and window is None:
        return None
    qpos = mx.arange(start, start + L)[:, None]
    # Buffer row j holds position j (unused rows >= start); block row i is start+i.
    kpos = mx.concatenate([mx.arange(cap), mx.arange(start, start + L)])[None]
    used = mx.concatenate([mx.arange(cap) < start, mx.ones((L,), dtype=mx.bool_)])[None]
    visible = mx.broadcast_to(used, (L, cap + L))
    return restrict(visible, qpos, kpos, causal=causal, window=window)


class StackedContext:
    """One layer's context K/V of several drafters side by side, for one
    batched draft block (batch.py: every row drafts in one forward).

    Row b's `BucketKVCache` buffer is copied into row b of one buffer as long
    as the longest (read-only: context is only ever written by a drafter's
    own `append_context`). `offset` holds each row's context length, so RoPE
    places its block where its own forward would; `sizes` are the rows'
    block lengths (anchor + drafted): a shorter row's padding positions are
    hidden from its real ones, so each row's logits are its solo block's.
    """

    def __init__(
        self,
        caches: Sequence[BucketKVCache],
        sizes: Sequence[int],
        shared: Optional[dict] = None,
    ):
        """`shared`: one dict for the layers of one forward, whose contexts
        have the same lengths (a draft's layers hold the same context): they
        share its offsets, sizes and masks instead of building each (a 4-row
        draft of 5 layers built the same mask five times a cycle)."""
        assert all(c.keys is not None for c in caches), "a drafter without context"
        cap = max(c.keys.shape[2] for c in caches)

        def stack(bufs):
            # Bucketed buffers mostly share their length: pad only the others
            # (a pad is a copy; a 4-row draft made ~40 of them a cycle).
            pad = lambda b: mx.pad(b, [(0, 0), (0, 0), (0, cap - b.shape[2]), (0, 0)])
            return mx.concatenate([b if b.shape[2] == cap else pad(b) for b in bufs])

        self.keys = stack([c.keys for c in caches])
        self.values = stack([c.values for c in caches])
        self.shared = {} if shared is None else shared
        if "offset" not in self.shared:
            self.shared["offset"] = mx.array([c.offset for c in caches], mx.int32)
            self.shared["sizes"] = mx.array(list(sizes), mx.int32)
        self.offset, self.sizes = self.shared["offset"], self.shared["sizes"]

    def block_mask(self, L: int, *, causal: bool, window: Optional[int]) -> mx.array:
        """(B, 1, L, cap + L) bool: row b's queries see its context and its
        own block's first sizes[b] positions (then causal / windowed)."""
        cap = self.keys.shape[2]
        key = ("mask", L, cap, causal, window)
        if key not in self.shared:
            start = self.offset[:, None, None]
            qpos = start + mx.arange(L)[:, None]
            j = mx.arange(cap + L)
            kpos = mx.where(j < cap, j, start + j - cap)
            used = mx.where(j < cap, j < start, j - cap < self.sizes[:, None, None])
            visible = mx.broadcast_to(used, (used.shape[0], L, cap + L))
            mask = restrict(visible, qpos, kpos, causal=causal, window=window)
            self.shared[key] = mask[:, None]
        return self.shared[key]


def restrict(visible, qpos, kpos, *, causal: bool, window: Optional[int]):
    """Narrow a visibility mask to causal order and a sliding window (the
    draft's `layer_types`); shared with the training objective."""
    if causal:
        visible = visible & (kpos <= qpos)
    if window is not None:
        visible = visible & (qpos - kpos < window)
        if not causal:
            visible = visible & (kpos - qpos < window)
    return visible


class DraftMLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x):
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, args: DraftArgs, layer_idx: int):
        super().__init__()
        self.self_attn = DraftAttention(args, layer_idx)
        self.mlp = DraftMLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(
            args.hidden_size, eps=args.rms_norm_eps
        )

    def __call__(self, x: mx.array, cache: KVCache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    def __init__(self, args: DraftArgs):
        super().__init__()
        self.args = args
        n_feat = len(args.target_layer_ids)
        self.layers = [DraftLayer(args, i) for i in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.fc = nn.Linear(n_feat * args.hidden_size, args.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    @property
    def dtype(self):
        return self.fc.weight.dtype

    def make_cache(self) -> List[BucketKVCache]:
        return [BucketKVCache() for _ in self.layers]

    def project(self, features: mx.array) -> mx.array:
        return self.hidden_norm(self.fc(features.astype(self.dtype)))

    def append_context(self, features: mx.array, cache: List[KVCache]):
        """Cache context K/V of newly committed positions (features: (B, T, k*H))."""
        ctx = self.project(features)
        for layer, c in zip(self.layers, cache):
            layer.self_attn.append_context(ctx, c)

    def __call__(
        self, block_embeds: mx.array, cache: List[KVCache], flush_every: int = 0
    ) -> mx.array:
        """Normed hidden states of the block; positions start at the cache
        offset (inside a block path's `Fitting`, through its kernels). With
        `flush_every` n > 0, every n-th layer's output (but the last) starts
        evaluating while Python builds the layers after it."""
        h = block_embeds.astype(self.dtype)
        last = len(self.layers) - 1
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            h = layer(h, c)
            if flush_every and i < last and (i + 1) % flush_every == 0:
                start_eval([h])
        return self.norm(h)


# ---- checkpoint format ------------------------------------------------------------


def expected_keys(args: DraftArgs) -> List[str]:
    keys = ["norm.weight", "fc.weight", "hidden_norm.weight"]
    for i in range(args.num_hidden_layers):
        p = f"layers.{i}."
        keys += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
        keys += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        keys += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
        keys += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return keys


def read_config(path, what: str) -> dict:
    """`path/config.json` as a dict; a missing or broken file is a one-line
    ValueError that names it."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{what} {path} has no config.json")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} is not a JSON object")
    return config


def load_draft(path, *, target=None, dtype: Optional[mx.Dtype] = None) -> DFlashDraft:
    """Load a z-lab format DFlash checkpoint directory.

    Args:
        path: directory with `config.json` and `*.safetensors`.
        target: a `Target` to check the draft against (hidden size, layer ids,
          vocabulary); each mismatch raises a one-line ValueError.
        dtype: cast the weights to this dtype (default: keep the file's).
    """
    path = Path(path)
    args = DraftArgs.from_config(read_config(path, "draft checkpoint"))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"draft checkpoint {path} has no *.safetensors file")
    weights = {}
    for f in files:
        weights.update(mx.load(str(f)))
    weights = {k.removeprefix("model."): v for k, v in weights.items()}
    for key in expected_keys(args):
        if key not in weights:
            raise ValueError(f"draft checkpoint {path} is missing weight '{key}'")
    if target is not None:
        check_against_target(args, target)
    model = DFlashDraft(args)
    model.load_weights(list(weights.items()), strict=False)
    if dtype is not None:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def check_against_target(args: DraftArgs, target) -> None:
    if args.hidden_size != target.hidden_size:
        raise ValueError(
            f"draft hidden_size {args.hidden_size} != target hidden size "
            f"{target.hidden_size}"
        )
    for i in args.target_layer_ids:
        if not 0 <= i < target.num_layers:
            raise ValueError(
                f"draft target_layer_ids entry {i} is out of range for a "
                f"{target.num_layers}-layer target"
            )
    vocab = target.vocab_size
    if not 0 <= args.mask_token_id < vocab:
        raise ValueError(
            f"draft mask_token_id {args.mask_token_id} is outside the target "
            f"vocabulary ({vocab})"
        )


def save_draft(model: DFlashDraft, path) -> None:
    """Write `config.json` + `model.safetensors` in the z-lab format."""
    from mlx.utils import tree_flatten

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "config.json", "w") as f:
        json.dump(model.args.to_config(), f, indent=2)
    mx.save_safetensors(
        str(path / "model.safetensors"),
        dict(tree_flatten(model.parameters())),
        metadata={"format": "mlx"},
    )
