"""Greedy speculative decoding is token-for-token stock mlx_lm greedy decoding."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from helpers import PROMPT, N, make_drafter, run, setup
from models import CONFIGS, VOCAB

from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import OracleDrafter, PromptLookupDrafter
from mlx_dflash.target import Target

FAMILIES = list(CONFIGS)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["oracle", "lookup", "dflash"])
@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_greedy_equals_stock(family, kind, block_size):
    model, ref = setup(family)
    target = Target(model)
    drafter = make_drafter(kind, target, ref)
    out, stats = run(target, drafter, max_tokens=N, block_size=block_size)
    assert out == ref
    assert stats.emitted == N - 1  # the first token comes from prefill


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_acceptance_at_every_position(family):
    model, _ = setup(family)
    stock = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=200)]
    drafter = OracleDrafter(PROMPT + stock, vocab_size=VOCAB, schedule=list(range(16)))
    out, stats = run(Target(model), drafter, max_tokens=200, block_size=16)
    assert out == stock
    # Cycle c rejects draft position c+1: every position is both rejected and accepted.
    assert stats.cycles >= 16
    for i in range(15):
        assert stats.accepted_at[i] > 0, i
        assert stats.drafted_at[i] > stats.accepted_at[i], i


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_plain_path_block_size_one(family):
    model, ref = setup(family)
    out, stats = run(Target(model), PromptLookupDrafter(), max_tokens=N, block_size=1)
    assert out == ref
    assert stats.drafted == 0 and stats.tau == 1.0


@pytest.mark.parametrize("family", FAMILIES)
def test_stop_token_inside_accepted_block(family):
    model, ref = setup(family)
    # A token first seen mid-way, inside a fully accepted 16-block.
    k = next(i for i in range(5, N) if ref[i] not in ref[:i])
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB)
    out, stats = run(
        Target(model), drafter, max_tokens=N, block_size=16, stop_tokens=[ref[k]]
    )
    assert out == ref[: k + 1]
    assert stats.cycles == 1  # the stop landed inside the first block


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 23])
def test_max_tokens_mid_block(family, max_tokens):
    model, ref = setup(family)
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB)
    out, _ = run(Target(model), drafter, max_tokens=max_tokens, block_size=16)
    assert out == ref[:max_tokens]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["oracle", "dflash"])
def test_prompt_longer_than_prefill_chunk(family, kind):
    model, ref = setup(family)
    target = Target(model)
    drafter = make_drafter(kind, target, ref)
    out, _ = run(target, drafter, max_tokens=N, block_size=16, prefill_step_size=4)
    assert out == ref


def test_bad_arguments():
    model, _ = setup("llama")
    with pytest.raises(ValueError, match="block_size"):
        next(generate_step(Target(model), PROMPT, PromptLookupDrafter(), block_size=0))
    with pytest.raises(ValueError, match="empty"):
        next(generate_step(Target(model), [], PromptLookupDrafter()))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["oracle", "dflash"])
def test_bucketed_kv_cache_is_exact(family, kind):
    """Padded K/V + explicit mask (the CUDA no-recompile path) changes no token."""
    model, ref = setup(family)
    target = Target(model)
    drafter = make_drafter(kind, target, ref)
    cache = target.make_cache(bucket=True)
    assert any(type(c).__name__ == "BucketKVCache" for c in cache)
    out, _ = run(
        target, drafter, cache=cache, max_tokens=N, block_size=16, prefill_step_size=5
    )
    assert out == ref
