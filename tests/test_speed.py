"""The GPU speed paths change timing only: pipelined forwards and kernel-kept states."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import on_cuda
from models import tiny_model

from mlx_dflash.bench.shapes import build_target
from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.target import Target

PROMPT = mx.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
BLOCK = mx.array([[7, 8, 9, 10, 11, 12]])


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_flushed_forward_is_the_same_forward(family):
    """async_eval every n layers while building changes nothing in the results."""
    runs = []
    for every, first, flush in ((0, None, False), (1, None, True), (2, None, True), (2, 1, True)):
        target = Target(
            tiny_model(family), capture_layers=[0, 1], flush_every=every, flush_first=first
        )
        cache = target.make_cache()
        target.forward(PROMPT, cache, flush=flush)
        logits, features = target.forward(BLOCK, cache, flush=flush)
        runs.append((np.array(logits), np.array(features)))
    for logits, features in runs[1:]:
        assert np.array_equal(logits, runs[0][0])
        assert np.array_equal(features, runs[0][1])


def test_verify_flush_schedule():
    """The layers a flushed verify starts: after `first`, then every `every`;
    switching the schedule leaves no earlier layer flushing; both or neither 0."""
    target = Target(tiny_model("llama"), flush_every=2)
    flushing = lambda: [i for i, l in enumerate(target.layers) if getattr(l, "_flush", False)]
    n = target.num_layers
    assert flushing() == list(range(1, n, 2))
    target.set_verify_flush(2, 1)
    assert flushing() == list(range(0, n, 2))
    target.set_verify_flush(0)
    assert flushing() == []
    with pytest.raises(ValueError, match="both 0"):
        target.set_verify_flush(2, 0)


def test_flushed_draft_pass_is_the_same_pass():
    """Starting a draft pass's layers while building the rest (what CUDA's
    `draft_flush_every` does) changes neither the drafts, their logits nor
    the draft's context cache."""
    from helpers import random_dflash

    runs = []
    for flush_every in (0, 1, 2):
        target = Target(tiny_model("llama"), capture_layers=[0, 1])
        target.set_draft_flush(flush_every)
        drafter = random_dflash(target, layers=3)
        assert drafter.flush_every == flush_every
        cache = target.make_cache()
        _, features = target.forward(PROMPT, cache)
        drafter.commit(PROMPT[0].tolist(), features)
        logits = drafter._logits(5, 4)
        runs.append((np.array(logits), [np.array(c.state[0]) for c in drafter.cache]))
    for logits, keys in runs[1:]:
        assert np.array_equal(logits, runs[0][0])
        assert all(np.array_equal(k, r) for k, r in zip(keys, runs[0][1]))


def test_cuda_path_flushes_draft_passes_cpu_does_not():
    from mlx_dflash.kernels.cuda import CudaKernels
    from mlx_dflash.kernels.path import BlockPath

    assert BlockPath.choose(None).draft_flush_every == 0
    cuda = BlockPath.choose(CudaKernels())
    assert cuda.draft_flush_every == CudaKernels.draft_flush_every > 0
    assert cuda.but(draft_flush_every=0).draft_flush_every == 0
    assert cuda.but(linear=False).draft_flush_every == cuda.draft_flush_every
    with pytest.raises(ValueError, match="draft_flush_every"):
        cuda.but(draft_flush_every=-1)


def test_flush_taps_are_plain_pass_through_outside_forward():
    model = tiny_model("llama")
    ref = np.array(model(PROMPT))
    Target(model, flush_every=1)
    assert np.array_equal(np.array(model(PROMPT)), ref)


@on_cuda
def test_rollback_from_kept_step_states_equals_replay():
    """On CUDA rollback picks the kernel's per-step state; it must equal a replay."""
    states = {}
    for keep_steps in (True, False):
        # head dims of 32: the CUDA kernel applies (the test models' 16 do not)
        target = Target(build_target("tiny-qwen3.5", dtype=mx.float32))
        cache = target.make_cache()
        target.forward(PROMPT, cache)
        saved = snapshot(cache, target.delta_taps)
        target.forward(BLOCK, cache)
        for d in target.delta_taps.values():
            assert d.layer.step_states.states.shape[0] == BLOCK.shape[1]
        if not keep_steps:
            for d in target.delta_taps.values():
                d.layer.step_states.states = None
        rollback(cache, target.delta_taps, saved, verified=BLOCK.shape[1], kept=3)
        states[keep_steps] = [np.array(cache[i][1]) for i in target.delta_taps]
    for a, b in zip(states[True], states[False]):
        assert np.abs(a - b).max() <= 1e-5


def test_bucket_cache_prefill_chunks_take_the_causal_path():
    """Chunks longer than `max_bucketed` see exact keys with mlx_lm's causal mask;
    verify-sized inputs see the padded buffer. Logits equal a plain cache's."""
    from mlx_lm.models.cache import KVCache

    model = tiny_model("qwen3")
    prompt = mx.array([[i % 90 + 3 for i in range(150)]])
    logits = {}
    for bucket in (False, True):
        target = Target(model)
        cache = target.make_cache(bucket=bucket)
        first = target.forward(prompt[:, :100], cache)[0]  # 100 > 64: causal path
        rest = target.forward(prompt[:, 100:], cache)[0]  # 50 <= 64: padded + mask
        logits[bucket] = np.concatenate([np.array(first), np.array(rest)], axis=1)
    assert isinstance(cache[0], KVCache) and cache[0].keys.shape[2] == 256
    assert np.abs(logits[True] - logits[False]).max() < 1e-5


def run_with_variant(monkeypatch, *argv):
    """bench/probes/with_variant.py's main with `argv`, CUDA's draft flush and
    the bench's program name restored afterwards."""
    import sys
    from pathlib import Path

    from mlx_dflash.bench import cli
    from mlx_dflash.kernels.cuda import CudaKernels

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench" / "probes"))
    monkeypatch.setattr(CudaKernels, "draft_flush_every", CudaKernels.draft_flush_every)
    monkeypatch.setattr(cli, "PROGRAM", cli.PROGRAM)
    monkeypatch.setattr(sys, "argv", ["with_variant.py", *argv])
    try:
        __import__("with_variant").main()
    finally:
        sys.modules.pop("with_variant", None)
        sys.modules.pop("probe_linear_variants", None)


def test_with_variant_sets_the_draft_flush(tmp_path, monkeypatch, capsys):
    """bench/probes/with_variant.py --draft-flush N runs a command with CUDA's
    draft flush set to N (how h100-q4-qwen3-8b-drafts-s40-noflush ran)."""
    script = tmp_path / "show.py"
    script.write_text(
        "from mlx_dflash.kernels.cuda import CudaKernels\n"
        "from mlx_dflash.kernels.path import BlockPath\n"
        "print('flush', BlockPath.choose(CudaKernels()).draft_flush_every)\n"
    )
    run_with_variant(monkeypatch, "--draft-flush", "0", "--", str(script))
    assert "flush 0" in capsys.readouterr().out


def test_with_variant_names_itself_in_the_bench_results(tmp_path, monkeypatch):
    """A bench run through with_variant.py records the wrapper's command, so
    its results say what produced them."""
    bench = (
        "--shape tiny-qwen3 --dtype float32 --peaked --draft lookup --suites code "
        "--prompts-per-suite 1 --max-tokens 8 --repeats 1 --cooldown 0 --no-profile --no-png "
        f"--out {tmp_path / 'w'}"
    ).split()
    run_with_variant(monkeypatch, "--draft-flush", "0", "--", "-m", "mlx_dflash.bench", *bench)
    command = (tmp_path / "w.md").read_text().split("```")[1].strip()
    assert command.startswith(
        "python3 bench/probes/with_variant.py --draft-flush 0 -- -m mlx_dflash.bench --shape"
    )
