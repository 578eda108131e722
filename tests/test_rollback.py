"""After partially accepted cycles every cache equals plain autoregressive decoding's."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache
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
