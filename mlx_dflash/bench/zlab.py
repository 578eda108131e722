"""z-lab's reference DFlash loop as a bench arm: `--draft zlab:DIR`.

Where z-lab's package is installed (PyPI `dflash` 0.1.0: `pip install
--no-deps dflash==0.1.0`; its declared dependencies are for its own datasets
and CUDA benchmark, not for `dflash.model_mlx`), the arm runs
`dflash.model_mlx.stream_generate` on the same prompts, lengths, temperatures
and repeats as our arms, alternating with stock mlx_lm like them, and fills
the same `RunResult`:
  - its own copy of the target's weights (`_patch_model` wraps the layers it
    reads in place, so it cannot share the `Target` our arms tap);
  - the checkpoint loaded by z-lab's `load_draft`, cast to the dtype our arm
    runs the same checkpoint in (`device.draft_dtype`: fp32 on the CPU);
  - decode tok/s and TTFT timed by `TokenStream` as ours are; τ from the
    lengths it yields per cycle (accepted drafts + the target's token), the
    block it verified that cycle from its own rule `min(B, max_tokens - n + 1)`.
"""

from pathlib import Path
from typing import Optional, Sequence
from unittest import mock

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..device import backend, device_info, draft_dtype
from ..load import block_size_for, draft_path
from ..sampling import SamplingParams
from ..stats import SpecStats
from ..stream import TokenStream
from .runner import Arm, RunResult

PREFIX = "zlab:"
INSTALL = "pip install --no-deps dflash==0.1.0"


def import_model_mlx():
    """z-lab's `dflash.model_mlx`, or a one-line ValueError saying how to get it."""
    try:
        from dflash import model_mlx
    except ImportError as e:
        raise ValueError(
            f"--draft {PREFIX}DIR needs z-lab's reference package: {INSTALL} "
            f"({type(e).__name__}: {e})"
        ) from None
    return model_mlx


def load_zlab_draft(model_mlx, path: Path, dtype: Optional[mx.Dtype]):
    """The checkpoint at `path` as z-lab's `DFlashDraftModel`, in `dtype`."""
    # `load_draft` resolves its argument with huggingface_hub.snapshot_download,
    # which rejects a local directory; for this call the name its module looks
    # up hands the (already resolved) directory back unchanged.
    with mock.patch.object(model_mlx, "snapshot_download", lambda repo, **_: repo):
        draft = model_mlx.load_draft(str(path))
    if dtype is not None:
        draft.set_dtype(dtype)
    return draft


class _NoText:
    """A detokenizer that keeps nothing: our arms time token ids, not text."""

    last_segment = ""

    def reset(self):
        pass

    def add_token(self, token):
        pass

    def finalize(self):
        pass


class _Ids(TokenizerWrapper):
    """All that z-lab's loop reads of a tokenizer when the prompt is token ids:
    the EOS ids (none: the bench runs fixed lengths, EOS off, as our arms do)
    and a detokenizer. Works for `--shape` targets, which have no tokenizer."""

    def __init__(self):  # no Hugging Face tokenizer behind it
        self._tokenizer = None
        self._detokenizer = _NoText()
        self._eos_token_ids = set()


def run_zlab(
    model_mlx,
    model,
    draft,
    prompt: Sequence[int],
    max_tokens: int,
    block: int,
    prefill_step: int,
    sampling: Optional[SamplingParams] = None,
) -> RunResult:
    """One generation by z-lab's loop, timed and counted as `run_spec` does ours."""
    mx.clear_cache()
    mx.reset_peak_memory()
    temp = 0.0
    if sampling is not None and not sampling.greedy:
        temp = sampling.temperature
        mx.random.seed(sampling.seed or 0)  # its sampler draws from mx.random
    stats, stream, tokens = SpecStats(block), TokenStream(), []
    gen = model_mlx.stream_generate(
        model,
        draft,
        _Ids(),
        mx.array(prompt),
        block_size=block,
        max_tokens=max_tokens,
        temperature=temp,
        top_p=sampling.top_p if temp else 1.0,
        top_k=sampling.top_k if temp else 0,
        prefill_step_size=prefill_step,
    )
    for response in gen:
        if response.accepted is not None:  # a cycle (not the first token)
            verified = min(block, max_tokens - len(tokens) + 1)
            n = len(response.tokens)
            stats.record(drafted=verified - 1, accepted=n - 1, emitted=n)
        for t in response.tokens:
            tokens.append(int(t))
            stream.add(tokens[-1])
        if len(tokens) >= max_tokens:
            break
    stream.finish()
    gen.close()  # after the clock stops, as ours ends outside it too
    d = stats.as_dict()
    d["tau_decode"] = d["tau"]
    peak = mx.get_peak_memory() / 1e9
    return RunResult(tokens, stream.prefill_s, stream.decode_s, peak, d, stats)


def make_zlab_arm(spec: str, args, stock_model) -> Arm:
    """The arm for `--draft zlab:DIR` (DIR: a z-lab format checkpoint directory
    or Hugging Face repo id). `stock_model()` builds a fresh copy of the
    target's weights, untouched by our taps."""
    where = spec[len(PREFIX) :]
    if not where:
        raise ValueError(f"--draft {spec!r}: give a checkpoint after {PREFIX!r}")
    if "@q" in where:
        raise ValueError(
            f"--draft {spec}: z-lab's loop runs the checkpoint as saved (no @q)"
        )
    if args.min_p:
        raise ValueError(f"--min-p: z-lab's loop ({spec}) has no min-p sampling")
    if getattr(args, "world", None) is not None and args.world.size > 1:
        raise ValueError(f"--draft {spec}: z-lab's loop runs in one process")
    model_mlx = import_model_mlx()
    path = draft_path(where)
    requested = getattr(mx, args.dtype) if args.dtype else None
    dtype = draft_dtype(device_info(), backend(), requested=requested).dtype
    draft = load_zlab_draft(model_mlx, path, dtype)
    block = block_size_for(args.block_size, int(draft.config.block_size))
    model = stock_model()

    def run(prompt, max_tokens, prefill_step, sampling):
        return run_zlab(
            model_mlx, model, draft, prompt, max_tokens, block, prefill_step, sampling
        )

    name = f"zlab {Path(where.rstrip('/')).name}"
    return Arm(name, make=None, block_size=block, run=run)
