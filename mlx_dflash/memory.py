"""Memory guard: refuse a request the machine cannot hold, before allocating it.

A long prompt with a large `max_tokens` grows the target's KV cache, and on
Apple silicon running out of memory ends in an abort (or heavy swapping), not
an exception. So we estimate what a request adds on top of the loaded weights
and compare it with what the device has free:

- target attention layers: K + V rows (`k_proj`/`v_proj` widths) per token, in
  256-token steps as `KVCache` allocates them;
- GatedDeltaNet layers: conv state (K-1 rows of conv_dim, activation dtype) and
  recurrent state (Hv x Dv x Dk, fp32), twice while a verify pass keeps the
  pre-verify snapshot for rollback;
- the DFlash drafter's context K/V (one entry per draft layer);
- activations: one prefill chunk, a verify block's logits.
"""

import math
import re
from dataclasses import asdict, dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

KV_STEP = 256  # KVCache and BucketKVCache grow in steps of this many tokens


def _out_dim(linear) -> int:
    return linear.weight.shape[0]


def _dtype_bytes(module) -> int:
    """Bytes per element of what a (possibly quantized) layer outputs."""
    w = module.weight
    if w.dtype in (mx.uint32, mx.uint8) and "scales" in module:
        return module.scales.dtype.size
    return w.dtype.size


def nbytes(module: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


@dataclass
class MemoryEstimate:
    """Bytes; `new` is what a request adds on top of the resident weights."""

    tokens: int
    weights: int
    target_kv: int
    gdn_state: int
    draft_kv: int
    transient: int  # rollback snapshot of the recurrent state + activations

    @property
    def new(self) -> int:
        return self.target_kv + self.gdn_state + self.draft_kv + self.transient

    @property
    def total(self) -> int:
        return self.weights + self.new

    def as_dict(self) -> dict:
        return {**asdict(self), "new": self.new, "total": self.total}


@dataclass
class MemoryModel:
    """Per-token and fixed sizes of one target + drafter pair (see `memory_model`)."""

    weights: int
    kv_per_token: int  # all target attention layers, K + V
    gdn_state: int  # all GatedDeltaNet layers, conv + recurrent state
    draft_kv_per_token: int
    act_bytes: int
    hidden: int
    intermediate: int
    vocab: int
    attn_heads: int

    def estimate(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        block_size: int = 16,
        prefill_step: int = 2048,
        backend: str = "cpu",
    ) -> MemoryEstimate:
        tokens = prompt_tokens + max_tokens + block_size
        rows = math.ceil(tokens / KV_STEP) * KV_STEP
        chunk = min(prefill_step, prompt_tokens)
        act = chunk * (6 * self.hidden + 3 * self.intermediate) * self.act_bytes
        act += 3 * block_size * self.vocab * 4  # verify logits, probabilities
        if backend == "cpu":  # unfused attention: scores are materialized
            act += chunk * self.attn_heads * rows * 4
        return MemoryEstimate(
            tokens=tokens,
            weights=self.weights,
            target_kv=rows * self.kv_per_token,
            gdn_state=self.gdn_state,
            draft_kv=rows * self.draft_kv_per_token,
            transient=self.gdn_state + act,
        )


def memory_model(target, drafter=None) -> MemoryModel:
    """Measure a loaded `Target` (and DFlash drafter, if any) for `estimate`."""
    from .target import _unwrap

    lm_args = getattr(target.lm, "args", None)
    emb = target.embed_tokens
    act_bytes = _dtype_bytes(emb)
    kv = gdn = 0
    heads = 0
    for i, kind in enumerate(target.kinds):
        layer = _unwrap(target.layers[i])
        if kind.mixer == "gated_delta":
            la = target.delta_taps[i].layer
            conv = (la.conv_kernel_size - 1) * la.conv_dim * act_bytes
            gdn += conv + la.num_v_heads * la.head_v_dim * la.head_k_dim * 4
            continue
        attn = layer["self_attn"] if "self_attn" in layer else None
        if attn is not None and "k_proj" in attn and "v_proj" in attn:
            b = _dtype_bytes(attn.k_proj)
            kv += (_out_dim(attn.k_proj) + _out_dim(attn.v_proj)) * b
            heads = max(heads, getattr(attn, "n_heads", 0) or 0)
        else:  # e.g. latent attention: fall back to the config
            n_kv = getattr(lm_args, "num_key_value_heads", 1)
            hd = getattr(lm_args, "head_dim", None) or target.hidden_size // max(
                getattr(lm_args, "num_attention_heads", 1), 1
            )
            kv += 2 * n_kv * hd * act_bytes
    weights = nbytes(target.model)
    draft_kv = 0
    draft = getattr(drafter, "draft", None)
    if draft is not None:
        a = draft.args
        b = draft.dtype.size
        draft_kv = a.num_hidden_layers * 2 * a.num_key_value_heads * a.head_dim * b
        weights += nbytes(draft)
    intermediate = getattr(lm_args, "intermediate_size", 4 * target.hidden_size)
    return MemoryModel(
        weights=weights,
        kv_per_token=kv,
        gdn_state=gdn,
        draft_kv_per_token=draft_kv,
        act_bytes=act_bytes,
        hidden=target.hidden_size,
        intermediate=intermediate if isinstance(intermediate, int) else 0,
        vocab=emb.weight.shape[0],
        attn_heads=heads or getattr(lm_args, "num_attention_heads", 1) or 1,
    )


def meminfo_available(text: Optional[str] = None) -> Optional[int]:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None elsewhere."""
    if text is None:
        try:
            with open("/proc/meminfo") as f:
                text = f.read()
        except OSError:
            return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def available_memory(
    info: dict, backend: str, *, limit: Optional[int] = None
) -> Optional[int]:
    """Bytes a request may still allocate; None when it cannot be told.

    Args:
        info: `mx.device_info()` of the device.
        backend: "metal", "cuda" or "cpu".
        limit: a cap on this process's total (`--max-memory-gb`).
    """
    active = mx.get_active_memory()
    free = None
    if backend == "metal" and info.get("max_recommended_working_set_size"):
        free = int(info["max_recommended_working_set_size"]) - active
    elif backend == "cuda" and info.get("total_memory"):
        free = int(info["total_memory"]) - active
    else:
        free = meminfo_available()
    if limit is not None:
        free = limit - active if free is None else min(free, limit - active)
    return None if free is None else max(free, 0)


def gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def check_memory(estimate: MemoryEstimate, available: Optional[int]) -> None:
    """Raise a one-line ValueError when `estimate` does not fit in `available`."""
    if available is None or estimate.new <= available:
        return
    raise ValueError(
        f"not enough memory for {estimate.tokens} tokens (prompt + max_tokens + "
        f"one block): needs ~{gb(estimate.new)} beyond the loaded weights "
        f"(target KV {gb(estimate.target_kv)}, recurrent state "
        f"{gb(estimate.gdn_state)}, drafter KV {gb(estimate.draft_kv)}, "
        f"activations {gb(estimate.transient - estimate.gdn_state)}), "
        f"{gb(available)} available; shorten the prompt or max_tokens"
    )
