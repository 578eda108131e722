"""After partially accepted cycles every cache equals plain autoregressive decoding's."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache
from helpers import random_dflash
from models import CONFIGS, VOCAB, tiny_model

from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import OracleDrafter
from mlx_dflash.target import Target

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


def autoregressive_cache(model, tokens):
    """The cache stock mlx_lm builds: prompt in one pass, then one token at a time."""
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    for t in tokens:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def assert_same_cache(ours, ref):
    assert len(ours) == len(ref)
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert isinstance(a, type(b)), i
        if isinstance(a, KVCache):
            assert a.offset == b.offset, i
            for x, y in zip(a.state[:2], b.state[:2]):
                x, y = x[..., : a.offset, :], y[..., : b.offset, :]
                assert np.abs(np.array(x) - np.array(y)).max() <= 1e-5, i
        else:
            assert isinstance(a, ArraysCache)
            for x, y in zip(a.cache, b.cache):
                assert x.shape == y.shape and x.dtype == y.dtype, i
                assert np.abs(np.array(x) - np.array(y)).max() <= 1e-5, i


@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("schedule", [[0, 3, 7, 1, 14, 2, 9], [5], [15]])
@pytest.mark.parametrize("bucket", [False, True])
def test_cache_after_partial_cycles(family, schedule, bucket):
    model = tiny_model(family)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=40)]
    target = Target(model)
    cache = target.make_cache(bucket=bucket)
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB, schedule=schedule)
    out = [
        t for t, _ in generate_step(target, PROMPT, drafter, cache=cache, max_tokens=40)
    ]
    assert out == ref
    # Caches hold the prompt and every emitted token but the last.
    assert_same_cache(cache, autoregressive_cache(model, out[:-1]))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("bucket", [False, True])
def test_stop_inside_pipelined_plain_stretch(family, bucket):
    """Plain stretches run pipelined (step t+1 queued before step t's token is
    read); a stop token mid-stretch undoes the queued step, so the caches still
    hold the prompt and every emitted token but the last."""
    from mlx_dflash.fallback import Fallback
    from mlx_dflash.stats import SpecStats

    model = tiny_model(family)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=40)]
    # Every draft wrong: after one cycle the policy decodes plainly in
    # stretches of 8, 16, ... (break_even fixed: deterministic decisions).
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB, schedule=[0] * 100)
    fallback = Fallback(window=1, plain_tokens=8, break_even=2.0)
    # A token first seen well inside the second stretch (not at its ends).
    k = next(i for i in range(14, 40) if ref[i] not in ref[:i])
    target, stats = Target(model), SpecStats(16)
    cache = target.make_cache(bucket=bucket)
    steps, forward = [], target.forward
    target.forward = lambda x, c, **kw: steps.append(x.shape[1]) or forward(x, c, **kw)
    out = [
        t
        for t, _ in generate_step(
            target,
            PROMPT,
            drafter,
            cache=cache,
            max_tokens=40,
            stop_tokens=[ref[k]],
            fallback=fallback,
            stats=stats,
        )
    ]
    assert out == ref[: k + 1]
    # One more plain forward than plain tokens: the step queued after the stop.
    assert stats.plain_tokens >= 8 and steps.count(1) == stats.plain_tokens + 1
    assert_same_cache(cache, autoregressive_cache(model, out[:-1]))
    # The drafter saw every committed token: its context is whole.
    assert drafter.length == len(PROMPT) + len(out) - 1


def _drafter_length(drafter):
    if isinstance(drafter, OracleDrafter):
        return drafter.length
    return drafter.cache[0].offset


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
@pytest.mark.parametrize("temperature", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["spec", "plain", "dflash"])
def test_close_mid_cycle_rewinds_caches(family, temperature, mode):
    """A caller that stops early just closes the generator: its `finally`
    leaves the caches and the drafter holding prompt + received[:-1], as plain
    decoding of the tokens received would (mid-cycle, mid plain stretch)."""
    from mlx_dflash.fallback import Fallback
    from mlx_dflash.sampling import SamplingParams

    model = tiny_model(family)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=40)]
    sampling = SamplingParams(temperature=temperature, seed=3)
    # "spec": whole cycles of 16, then partial ones. "plain": every draft
    # wrong, so pipelined plain stretches of 8, 16; "dflash" (random) too.
    schedule, fallback = [15, 15, 5, 9], None
    if mode != "spec":
        schedule, fallback = [0] * 100, Fallback(window=1, break_even=2.0)
    overshoot = []
    for stop_after in range(1, 30, 3):
        target = Target(model)
        cache = target.make_cache()
        if mode == "dflash":
            drafter = random_dflash(target, layers=1)
        else:
            drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB, schedule=schedule)
        steps = generate_step(
            target,
            PROMPT,
            drafter,
            cache=cache,
            max_tokens=40,
            sampling=sampling,
            fallback=fallback,
        )
        out = [t for _, (t, _) in zip(range(stop_after), steps)]
        n = len(PROMPT) + len(out) - 1
        attention = next(c for c in cache if isinstance(c, KVCache))
        overshoot.append(attention.offset - n)
        steps.close()
        if temperature == 0:
            assert out == ref[:stop_after]
        assert_same_cache(cache, autoregressive_cache(model, out[:-1]))
        assert _drafter_length(drafter) == n
    # Some of those stops fell inside a cycle or stretch, past the tokens given.
    assert max(overshoot) > 0, overshoot
