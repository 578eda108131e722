"""Load a target and build a drafter from command-line style specs."""

from pathlib import Path
from typing import Optional, Tuple

import mlx.core as mx

from .draft import load_draft
from .drafters import DFlashDrafter, Drafter, PromptLookupDrafter
from .target import Target


def load_target(path: str, *, dtype: Optional[mx.Dtype] = None) -> Tuple[Target, object]:
    """Load a target by HF repo id, local mlx_lm directory, or `.gguf` file.

    Returns `(target, tokenizer)`; `tokenizer` is an mlx_lm `TokenizerWrapper`.
    """
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
        spec: "lookup" (prompt lookup), "none" (plain decoding), or a z-lab
          format DFlash checkpoint directory.
        target: the loaded target; DFlash drafters tap its layers.

    Returns `(drafter, native_block_size)`; the block size is None when the
    drafter has no preferred one.
    """
    if spec is None or spec == "none":
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
