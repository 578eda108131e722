"""Speculative sampling is distributed exactly as sampling from the target alone."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.utils import _get_classes
from models import CONFIGS, tiny_model
from scipy.stats import chisquare

from mlx_dflash import sampling
from mlx_dflash.decode import generate_step
from mlx_dflash.draft import DFlashDraft, DraftArgs
from mlx_dflash.drafters import DFlashDrafter, OracleDrafter
from mlx_dflash.sampling import SamplingParams, probs
from mlx_dflash.target import Target

V = 8
PROMPT = [1, 5, 3, 7, 2]
SAMPLES = 20_000


def small_vocab_model():
    # Small and cheap: the test draws tens of thousands of sequences on a CPU.
    config = dict(
        CONFIGS["llama"],
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(3)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * 0.7 if p.ndim == 2 else p, model.parameters()))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def exact_joint(model, params):
    """P(first three tokens) under target-only sampling, by enumeration."""

    def dist(prefix):
        logits = model(mx.array([PROMPT + list(prefix)]))[0, -1]
        return np.array(probs(logits, params)).astype(np.float64)

    joint = np.zeros((V, V, V))
    p1 = dist(())
    for a in range(V):
        if p1[a] == 0:
            continue
        p2 = dist((a,))
        for b in range(V):
            if p2[b] == 0:
                continue
            joint[a, b] = p1[a] * p2[b] * dist((a, b))
    joint = joint.ravel().astype(np.float64)
    return joint / joint.sum()  # fp32 rows sum to 1 only within rounding


def random_drafter(target):
    mx.random.seed(5)
    args = DraftArgs(
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=V,
        target_layer_ids=[0, 1],
        mask_token_id=0,
        rope_theta=10000.0,
    )
    draft = DFlashDraft(args)
    draft.set_dtype(mx.float32)
    target.set_capture_layers(args.target_layer_ids)
    return DFlashDrafter(draft, target)


def sample_counts(target, drafter, params, n):
    counts = np.zeros(V**3)
    for s in range(n):
        p = SamplingParams(**{**params.__dict__, "seed": s})
        out = [
            t
            for t, _ in generate_step(
                target, PROMPT, drafter, max_tokens=5, block_size=3, sampling=p
            )
        ][:3]
        counts[(out[0] * V + out[1]) * V + out[2]] += 1
    return counts


def chi2_pvalue(counts, joint):
    # Pool cells with small expectation so the chi-square approximation holds.
    expected = joint * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert counts[joint == 0].sum() == 0, "sampled a token the target cannot produce"
    return chisquare(obs, exp).pvalue


SETTINGS = {
    "plain": SamplingParams(temperature=1.0),
    "filtered": SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05),
}


@pytest.fixture(scope="module")
def model():
    return small_vocab_model()


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_joint_distribution_matches_target(model, setting):
    params = SETTINGS[setting]
    target = Target(model)
    # A drafter with its own distribution q (DFlash) and a one-hot one (oracle).
    greedy = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=8)]
    drafters = [random_drafter(target), OracleDrafter(PROMPT + greedy, vocab_size=V)]
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
    # A wrong rule is far off: a fifth of the samples already rejects it decisively.
    counts = sample_counts(target, random_drafter(target), params, SAMPLES // 5)
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
