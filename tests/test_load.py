"""One loading path: block-size rule, the default target in bench, drafter state, Job."""

import argparse
import copy
import json
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from models import VOCAB, save_tiny_shape_draft, tiny_model

from mlx_dflash import load
from mlx_dflash.bench import arms as bench_arms
from mlx_dflash.bench import cli as bench_cli
from mlx_dflash.drafters import DFlashDrafter, OracleDrafter, PromptLookupDrafter
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.server.job import Job, engine_name
from mlx_dflash.target import Target


def test_block_size_rule_flag_then_drafter_then_16():
    assert load.block_size_for(None, None) == 16
    assert load.block_size_for(None, 8) == 8
    assert load.block_size_for(4, 8) == 4
    assert load.block_size_for(None, 1) == 1  # --draft none


def _bench_args(argv):
    return bench_cli.build_parser(argparse.ArgumentParser()).parse_args(argv)


def test_bench_block_size_flag_beats_the_checkpoints(tmp_path):
    d = save_tiny_shape_draft(tmp_path / "draft")
    config = json.loads((Path(d) / "config.json").read_text())
    (Path(d) / "config.json").write_text(json.dumps({**config, "block_size": 8}))
    base = ["--shape", "tiny-qwen3", "--dtype", "float32", "--draft", f"{d},lookup"]
    for flag, want in [([], [8, 16]), (["--block-size", "4"], [4, 4])]:
        args = _bench_args(base + flag)
        target, _, _, make = bench_arms.load(args)
        arms = bench_arms.make_arms(args, target, VOCAB, make)
        assert [a.block_size for a in arms] == want


def test_bench_loads_the_default_target_as_generate_does(monkeypatch):
    """No --model: bench asks `load_target` for the default target itself (fp32
    on CPU), not for the default GGUF's path (which would keep Q4_1)."""
    seen = []

    def fake_load_target(path, **kw):
        seen.append((path, kw.get("dtype")))
        return Target(tiny_model("qwen3")), None

    monkeypatch.setattr(bench_arms, "load_target", fake_load_target)
    monkeypatch.setattr(bench_arms, "model_name", lambda m: "default")
    bench_arms.load(_bench_args(["--draft", "lookup"]))
    monkeypatch.setattr(load, "load_target", fake_load_target)
    pair = load.load_pair(None, "lookup")
    assert seen == [(None, None), (None, None)]
    assert pair.block_size == 16 and not pair.uses_draft_model


def _tiny_draft(target):
    from mlx_dflash.draft import DFlashDraft, DraftArgs

    mx.random.seed(0)
    args = DraftArgs(
        hidden_size=target.hidden_size,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
        target_layer_ids=[0, 1],
        mask_token_id=VOCAB - 1,
    )
    draft = DFlashDraft(args)
    mx.eval(draft.parameters())
    target.set_capture_layers(args.target_layer_ids)
    return draft


def test_drafter_state_round_trip():
    """`load_state(deepcopy(state()))` undoes a later `trim` and `commit`."""
    target = Target(tiny_model("qwen3"))
    features = mx.random.normal((1, 5, 2 * target.hidden_size))
    drafters = [
        PromptLookupDrafter(),
        OracleDrafter(list(range(40)), vocab_size=VOCAB),
        DFlashDrafter(_tiny_draft(target), target),
    ]

    def proposal(d):  # DFlash: its logits, since a random draft's argmax is flat
        return d._logits(3, 3) if isinstance(d, DFlashDrafter) else d.propose(3, 3)

    for drafter in drafters:
        feats = features if drafter.capture_layers else None
        drafter.start([1, 2, 3, 1, 2])
        drafter.commit([1, 2, 3, 1, 2], feats)
        saved = copy.deepcopy(drafter.state())
        before = proposal(drafter)
        drafter.trim(2)
        drafter.commit([9, 9, 9], None if feats is None else feats[:, :3])
        assert not mx.array_equal(proposal(drafter), before), drafter.name
        drafter.load_state(saved)
        assert mx.array_equal(proposal(drafter), before), drafter.name


def test_job_engine_name_from_its_sampling_and_speculative_flag():
    assert engine_name(True, True) == "speculative-greedy"
    job = Job(prompt=[1], max_tokens=1, sampling=SamplingParams(temperature=0.7))
    job.speculative = False
    assert job.engine == "target-sampling"
    job.speculative = True
    assert job.engine == "speculative-sampling"
