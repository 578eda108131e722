"""Published DFlash drafters, keyed by the target they were trained for.

`--model` without `--draft` looks the target up here. Names are compared after
normalising: the org (`Qwen/`, `mlx-community/`), a local path's parent folders,
and quantization / format suffixes (`-4bit`, `-MLX`, `-bf16`, `-mxfp4`, `-DWQ`,
`-Q4_K_M.gguf`, ...) are dropped, so `mlx-community/Qwen3-8B-4bit` finds the
drafter of `Qwen/Qwen3-8B`. Repo names are those of z-lab's own list
(github.com/z-lab/dflash, "Supported Models").
"""

import re
from pathlib import Path
from typing import Dict, Optional

# normalised target name -> Hugging Face repo of its DFlash drafter
DRAFTERS: Dict[str, str] = {
    "qwen3.5-4b": "z-lab/Qwen3.5-4B-DFlash",
    "qwen3.5-9b": "z-lab/Qwen3.5-9B-DFlash",
    "qwen3.5-27b": "z-lab/Qwen3.5-27B-DFlash",
    "qwen3.5-35b-a3b": "z-lab/Qwen3.5-35B-A3B-DFlash",
    "qwen3.5-122b-a10b": "z-lab/Qwen3.5-122B-A10B-DFlash",
    "qwen3.6-27b": "z-lab/Qwen3.6-27B-DFlash",
    "qwen3.6-35b-a3b": "z-lab/Qwen3.6-35B-A3B-DFlash",
    "qwen3-4b": "z-lab/Qwen3-4B-DFlash-b16",
    "qwen3-8b": "z-lab/Qwen3-8B-DFlash-b16",
    "qwen3-coder-30b-a3b-instruct": "z-lab/Qwen3-Coder-30B-A3B-DFlash",
    "qwen3-coder-next": "z-lab/Qwen3-Coder-Next-DFlash",
    "llama-3.1-8b-instruct": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
    "gpt-oss-20b": "z-lab/gpt-oss-20b-DFlash",
    "gpt-oss-120b": "z-lab/gpt-oss-120b-DFlash",
}

# Other spellings of the same targets (after normalising).
ALIASES: Dict[str, str] = {
    "qwen3-coder-30b-a3b": "qwen3-coder-30b-a3b-instruct",
    "llama3.1-8b-instruct": "llama-3.1-8b-instruct",
}

# Quantization / packaging suffixes that do not change which drafter fits.
_SUFFIX = re.compile(
    r"[-_.](\d+(\.\d+)?-?bits?|bf16|fp16|f16|fp32|f32|fp8|mlx|mxfp4|mxfp8|nvfp4"
    r"|dwq|awq|gptq|qat|dq|gguf|dynamic|q\d(_[a-z0-9]+)*|g\d+)$"
)


def normalize(name: str) -> str:
    """`mlx-community/Qwen3-8B-4bit` -> `qwen3-8b`; see the module docstring."""
    s = str(name).strip().rstrip("/")
    # A Hugging Face cache path: .../models--org--name/snapshots/<hash>
    cached = re.search(r"models--[^/]+--([^/]+)", s)
    s = cached.group(1) if cached else Path(s).name
    s = s.lower()
    if s.endswith(".gguf"):
        s = s[: -len(".gguf")]
    s = s.removeprefix("meta-")
    while True:
        stripped = _SUFFIX.sub("", s)
        if stripped == s:
            return s
        s = stripped


def resolve_draft(model: str) -> Optional[str]:
    """The published drafter repo for target `model`, or None when none is known."""
    key = normalize(model)
    return DRAFTERS.get(ALIASES.get(key, key))


def draft_for(model: str) -> str:
    """Like `resolve_draft`, but a one-line ValueError when no drafter is known."""
    repo = resolve_draft(model)
    if repo is None:
        raise ValueError(
            f"no published DFlash drafter is known for {model!r}; pass --draft "
            "(a checkpoint directory or repo id, 'lookup' or 'none') or train one "
            f"with `mlx-dflash train --model {model} --out DIR`"
        )
    return repo
