"""Speculative sampling is distributed exactly as sampling from the target alone."""

import mlx.core as mx
import numpy as np
import pytest
from helpers import SMALL_PROMPT as PROMPT
from helpers import SMALL_V as V
from helpers import (
    chi2_pvalue,
    exact_joint,
    sample_counts,
    small_drafter,
    small_vocab_model,
)
from mlx_lm.generate import generate_step as stock_generate_step
from models import tiny_model

from mlx_dflash import sampling
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import DFlashDrafter, OracleDrafter
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.target import Target

SAMPLES = 20_000

SETTINGS = {
    "plain": SamplingParams(temperature=1.0),
    "filtered": SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05),
}


@pytest.fixture(scope="module")
def model():
    return small_vocab_model()


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_joint_distribution_matches_target(model, setting):
    params = SETTINGS[setting]
    target = Target(model)
    # Drafters with their own distribution q (DFlash) and a one-hot one (oracle).
    greedy = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=8)]
    dflash = small_drafter(target)
    # With a draft vocabulary q is 0 off its ids; the target's own tokens there
    # come from the residual only.
    narrow = DFlashDrafter(dflash.draft, target, [1, 2, 4, 7])
    drafters = [dflash, narrow, OracleDrafter(PROMPT + greedy, vocab_size=V)]
    joint = exact_joint(model, params)
    for drafter in drafters:
        counts = sample_counts(target, drafter, params, SAMPLES // 2)
        assert chi2_pvalue(counts, joint) > 0.01, drafter.name


def test_wrong_acceptance_rule_is_detected(model, monkeypatch):
    """Accepting every draft token (ignoring p/q) must fail the same test."""
    real = sampling.speculative_accept

    def always_accept(draft, q, p, key):
        accepted, candidates = real(draft, q, p, key)
        return mx.ones_like(accepted), candidates

    monkeypatch.setattr("mlx_dflash.decode.speculative_accept", always_accept)
    params = SETTINGS["plain"]
    target = Target(model)
    # A wrong rule is far off: 250 samples gave p = 1.5e-75, 1,000 a p that
    # underflows to 0, against the 1e-6 asked here (4,000 before: the same verdict).
    counts = sample_counts(target, small_drafter(target), params, SAMPLES // 20)
    joint = exact_joint(model, params)
    assert chi2_pvalue(counts, joint) < 1e-6


def test_greedy_unchanged_by_sampling_path():
    model = tiny_model("qwen3_5")
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=30)]
    out = [
        t
        for t, _ in generate_step(
            Target(model),
            PROMPT,
            OracleDrafter(PROMPT + ref, vocab_size=96, error_rate=0.3),
            max_tokens=30,
            sampling=SamplingParams(temperature=0.0, seed=1),
        )
    ]
    assert out == ref


def test_seed_reproducible_and_logprobs():
    model = tiny_model("llama")
    target = Target(model)
    params = SamplingParams(temperature=0.8, seed=7)
    runs = [
        list(
            generate_step(
                target,
                PROMPT,
                OracleDrafter(PROMPT, vocab_size=96),
                max_tokens=12,
                sampling=params,
                logprobs=3,
            )
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    logits = model(mx.array([PROMPT]))[0, -1]
    lp = np.array(logits - mx.logsumexp(logits))
    token, _, (value, top) = runs[0][0]
    assert abs(value - lp[token]) < 1e-5
    assert [i for i, _ in top] == list(np.argsort(-lp)[:3])


def test_bad_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
