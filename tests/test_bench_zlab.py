"""`bench --draft DIR,zlab:DIR`: our loop beside z-lab's reference loop
(`dflash.model_mlx`, PyPI `dflash` 0.1.0), the same drafter on the same target."""

import json
import sys

import mlx.core as mx
import pytest
from models import VOCAB, save_tiny_model_dir, save_tiny_shape_draft

from mlx_dflash.bench import cli
from mlx_dflash.draft import DFlashDraft, DraftArgs, save_draft

needs_dflash = pytest.mark.skipif(
    __import__("importlib").util.find_spec("dflash") is None,
    reason="z-lab's dflash is not installed (pip install --no-deps dflash==0.1.0)",
)

ALIVE = (7, 11)  # the only tokens with a nonzero head row


def few_token_target(family: str, path) -> str:
    """A tiny mlx_lm directory whose head row is zero for every token but ALIVE.

    Greedy then picks an ALIVE token where its logit is positive, else token 0
    (the first of the exact-zero ties), so a random drafter reading the same
    head guesses right about half the time: τ between 1 and the block size,
    where a fully random pair (τ = 1) would check no acceptance at all."""
    save_tiny_model_dir(family, path)
    file = path / "model.safetensors"
    weights = mx.load(str(file))
    (head,) = [k for k in weights if k.endswith("lm_head.weight")]
    keep = mx.zeros((VOCAB, 1)).at[mx.array(ALIVE)].add(1.0)
    weights[head] = weights[head] * keep
    mx.save_safetensors(str(file), weights, metadata={"format": "mlx"})
    return str(path)


def tiny_draft(path) -> str:
    """A random 1-layer DFlash checkpoint for the `models.py` tiny targets."""
    mx.random.seed(1)
    args = DraftArgs(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        target_layer_ids=[1, 2],
        mask_token_id=VOCAB - 1,
        num_target_layers=4,
    )
    save_draft(DFlashDraft(args), str(path))
    return str(path)


def bench(tmp_path, target_flags: str, draft: str, extra: str = "") -> dict:
    cli.main(
        f"{target_flags} --draft {draft},zlab:{draft} --suites code "
        "--prompts-per-suite 1 --max-tokens 40 --repeats 2 --cooldown 0 "
        f"--no-profile --no-png {extra} --out {tmp_path / 'z'}".split()
    )
    return json.loads((tmp_path / "z.json").read_text())


@needs_dflash
@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_zlab_arm_matches_stock_and_our_tau(tmp_path, family):
    """Attention and hybrid (Hv != Hk) targets: both loops emit stock greedy's
    tokens, and the same drafter accepts the same tokens in both, cycle by
    cycle (equal τ and per-position acceptance counts). Drafted counts differ
    by design: once fewer than B tokens are left z-lab's loop drafts one
    position more than can be emitted (ours drafts left - 1)."""
    model = few_token_target(family, tmp_path / "target")
    draft = tiny_draft(tmp_path / "draft")
    res = bench(tmp_path, f"--model {model}", draft)
    (case,) = res["cases"]
    ours, theirs = case["arms"]["draft"], case["arms"]["zlab draft"]
    assert res["settings"]["arms"] == ["draft", "zlab draft"]
    for arm in (ours, theirs):
        assert arm["token_match"] == {"equal_pct": 100.0, "first_divergence": None}
        assert arm["decode_tps"]["n"] == 2 and arm["ttft_s"]["median"] > 0
    assert 1.2 < ours["spec"]["tau"] < 16
    assert theirs["spec"]["tau"] == ours["spec"]["tau"]
    assert theirs["spec"]["cycles"] == ours["spec"]["cycles"]
    assert theirs["spec"]["accepted_at"] == ours["spec"]["accepted_at"]
    assert [r["tau"] for r in theirs["per_run"]] == [r["tau"] for r in ours["per_run"]]


@needs_dflash
def test_zlab_arm_on_a_shape_target_and_sampled(tmp_path):
    """A `--shape` target (no tokenizer; z-lab's copy built again from the
    seed) at T = 0 and T = 1: greedy tokens are stock's, τ is recorded at both."""
    draft = save_tiny_shape_draft(tmp_path / "draft")
    res = bench(tmp_path, "--shape tiny-qwen3.5 --dtype float32", draft, "--temp 0,1")
    greedy, sampled = res["cases"]
    assert greedy["arms"]["zlab draft"]["token_match"]["equal_pct"] == 100.0
    assert sampled["arms"]["zlab draft"]["token_match"] is None  # n/a when sampled
    for case in (greedy, sampled):
        spec = case["arms"]["zlab draft"]["spec"]
        assert spec["runs"] == 2 and spec["tau"] >= 1.0 and spec["cycles"] > 0


def test_zlab_arm_without_dflash_says_how_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dflash", None)  # import dflash -> ImportError
    draft = save_tiny_shape_draft(tmp_path / "draft")
    with pytest.raises(SystemExit):
        cli.main(f"--shape tiny-qwen3 --draft zlab:{draft} --no-png".split())
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install --no-deps dflash==0.1.0" in err
