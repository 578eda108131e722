"""Bench: statistics, acceptance definitions, report writers, a tiny end-to-end run."""

import argparse
import json
import struct
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step as mlx_generate_step
from mlx_lm.sample_utils import make_sampler
from models import VOCAB, save_tiny_shape_draft, tiny_model

from mlx_dflash.bench import cli, report
from mlx_dflash.bench.cli import build_parser, sampling_settings
from mlx_dflash.bench.engine import (
    EngineDrafter,
    geometric_p,
    geometric_schedule,
    make_engine_drafter,
)
from mlx_dflash.bench.runner import (
    Arm,
    Case,
    pool_stats,
    run_baseline,
    run_case,
    run_spec,
)
from mlx_dflash.bench.shapes import draft_for_target
from mlx_dflash.bench.stats import ideal_speedup, run_order, summarize, token_match
from mlx_dflash.bench.suites import SUITES, load_suite, suite_prompts
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import DFlashDrafter, PromptLookupDrafter
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target


def test_summarize_median_min_max():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert summarize([5])["median"] == 5


def test_run_order_alternates():
    order = run_order(4, ["base", "a", "b"])
    assert order[0] == ["base", "a", "b"] and order[1] == ["b", "a", "base"]
    firsts = [o[0] for o in order]
    assert firsts.count("base") == firsts.count("b") == 2


def test_token_match():
    assert token_match([1, 2, 3], [1, 2, 3]) == {
        "equal_pct": 100.0,
        "first_divergence": None,
    }
    m = token_match([1, 2, 3, 4], [1, 2, 9, 4])
    assert m["equal_pct"] == 75.0 and m["first_divergence"] == 2
    assert token_match([1, 2, 3], [1, 2])["first_divergence"] == 2


def test_acceptance_definitions_hand_made():
    # B = 4: three cycles accepting 3, 0 and 1 of 3 drafted tokens.
    st = SpecStats(4)
    st.record(drafted=3, accepted=3, emitted=4)
    st.record(drafted=3, accepted=0, emitted=1)
    st.record(drafted=3, accepted=1, emitted=2)
    assert st.tau == pytest.approx((4 + 1 + 2) / 3)  # accepted + bonus per cycle
    assert st.acceptance_rate == pytest.approx(4 / 9)  # per drafted token
    assert st.draft_share == pytest.approx(4 / 7)  # of emitted tokens
    assert st.per_position == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert st.draft_share != st.acceptance_rate


def test_ideal_speedup():
    assert ideal_speedup(4.0, 10.0, 2.0, 18.0) == pytest.approx(2.0)


@pytest.mark.parametrize("tau", [1.5, 4.0, 6.5, 9.0])
def test_geometric_schedule_hits_tau(tau):
    p = geometric_p(tau, 16)
    assert sum(p**i for i in range(16)) == pytest.approx(tau, rel=1e-6)
    s = geometric_schedule(tau, 16, cycles=256)
    assert all(0 <= k <= 15 for k in s)
    assert sum(k + 1 for k in s) / len(s) == pytest.approx(tau, rel=0.02)
    assert sum(k + 1 for k in s[:32]) / 32 == pytest.approx(tau, rel=0.15)


def test_suites_ship_and_encode():
    for name in SUITES:
        assert load_suite(name)["name"] == name
    ids = suite_prompts("code", None, vocab_size=50, synthetic_tokens=20)
    assert len(ids) == 3 and all(len(p) == 20 and max(p) < 50 for _, p in ids)
    assert len(suite_prompts("long_8k", None, vocab_size=50)[0][1]) == 8192


class _CharTokenizer:
    has_chat_template = False

    def encode(self, text):
        return [ord(c) % 256 for c in text]


def test_agent_transcript_length():
    ids = suite_prompts("long_8k", _CharTokenizer())[0][1]
    assert 8192 - 64 <= len(ids) <= 8192


def _target(family="qwen3"):
    return Target(tiny_model(family))


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_engine_drafter_is_lossless_and_controls_tau(family):
    target = _target(family)
    draft = draft_for_target(
        target.model, target.num_layers, num_layers=1, block_size=8
    )
    target.set_capture_layers(draft.args.target_layer_ids)
    prompt = [1, 5, 9, 2, 7, 3]
    plain = [
        t
        for t, _ in generate_step(
            target, prompt, PromptLookupDrafter(), max_tokens=60, block_size=1
        )
    ]
    drafter = make_engine_drafter(
        draft, target, prompt + plain, tau=4.0, block_size=8, vocab_size=VOCAB
    )
    assert isinstance(drafter, EngineDrafter)
    st = SpecStats(8)
    out = [
        t
        for t, _ in generate_step(
            target, prompt, drafter, max_tokens=60, block_size=8, stats=st
        )
    ]
    assert out == plain
    assert 2.5 < st.tau < 5.0


def _results():
    target = _target()
    draft = draft_for_target(
        target.model, target.num_layers, num_layers=1, block_size=8
    )
    target.set_capture_layers(draft.args.target_layer_ids)
    arms = [
        Arm("lookup", lambda ref: PromptLookupDrafter(), 8),
        Arm(
            "engine τ=4",
            lambda ref: make_engine_drafter(
                draft, target, ref, tau=4, block_size=8, vocab_size=VOCAB
            ),
            8,
            tau_target=4,
            calibrate=True,
        ),
    ]
    case = Case("code", "tiny", [3, 1, 4, 1, 5, 9, 2, 6] * 3, 24)
    res = run_case(target, case, arms, repeats=2, cooldown=0.0)
    return {
        "title": "tiny",
        "settings": {"repeats": 2},
        "environment": report.environment(),
        "cases": [res],
    }


def test_end_to_end_and_writers(tmp_path):
    results = _results()
    c = results["cases"][0]
    assert c["baseline"]["decode_tps"]["n"] == 2 and c["baseline_deterministic"]
    for name, a in c["arms"].items():
        assert a["token_match"]["equal_pct"] == 100.0, name  # fp32: lossless
        assert a["speedup"]["n"] == 2 and a["ideal_speedup"] > 0
        assert {"verify_ms", "draft_ms", "cycle_ms", "t_ar_ms"} <= set(a["profile"])
    assert c["arms"]["engine τ=4"]["calibration"]["self_consistent"]

    paths = report.write(results, tmp_path / "r", "mlx-dflash bench --test")
    js, md, png = paths
    loaded = json.loads(js.read_text())
    assert loaded["command"] == "mlx-dflash bench --test" and len(loaded["cases"]) == 1
    text = md.read_text()
    assert (
        "mlx-dflash bench --test" in text
        and "acc/drafted" in text
        and "share from draft" in text
    )
    rows = [l for l in text.splitlines() if l.startswith("| code/tiny")]
    assert len(rows) == 3 and all(l.count("|") == len(report.HEADER) + 1 for l in rows)
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    assert w > 100 and h > 100
    assert "engine τ=4" in report.table(results)


# ---- sampling parameters ---------------------------------------------------------


def _dflash(target, block=8):
    draft = draft_for_target(
        target.model, target.num_layers, num_layers=1, block_size=block
    )
    target.set_capture_layers(draft.args.target_layer_ids)
    return draft


def test_sampling_settings_from_flags():
    parser = build_parser(argparse.ArgumentParser())
    args = parser.parse_args(
        "--temp 0,0.7,1.0 --top-p 0.9 --top-k 20 --min-p 0.05 --seed 7".split()
    )
    sps = sampling_settings(args)
    assert [sp.temperature for sp in sps] == [0.0, 0.7, 1.0]
    assert all(
        (sp.top_p, sp.top_k, sp.min_p, sp.seed) == (0.9, 20, 0.05, 7) for sp in sps
    )
    assert sampling_settings(parser.parse_args([]))[0].greedy  # default: greedy
    for bad in ["--temp=-0.5", "--top-p=0", "--top-k=-1", "--min-p=2"]:
        with pytest.raises(ValueError):
            sampling_settings(parser.parse_args([bad]))


def test_sampled_baseline_is_stock_make_sampler_and_seeded():
    target = _target()
    prompt, n = [3, 1, 4, 1, 5, 9, 2, 6], 24
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, min_p=0.02, seed=3)
    got = run_baseline(target, prompt, n, 2048, sp).tokens
    mx.random.seed(3)
    sampler = make_sampler(0.9, top_p=0.95, min_p=0.02, top_k=40)
    stock = mlx_generate_step(
        mx.array(prompt), target.model, max_tokens=n, sampler=sampler
    )
    assert got == [int(t) for t, _ in stock]
    assert run_baseline(target, prompt, n, 2048, sp).tokens == got
    other = run_baseline(target, prompt, n, 2048, replace(sp, seed=4)).tokens
    greedy = run_baseline(target, prompt, n, 2048).tokens
    assert other != got and greedy != got  # the seed and the temperature are used


def test_sampled_spec_run_is_seeded_speculative_sampling():
    target = _target()
    draft = _dflash(target)
    prompt, n = [3, 1, 4, 1, 5, 9, 2, 6], 24
    sp = SamplingParams(temperature=0.8, top_k=30, seed=5)
    r = run_spec(target, prompt, DFlashDrafter(draft, target), n, 8, 2048, sp)
    direct = generate_step(
        target,
        prompt,
        DFlashDrafter(draft, target),
        max_tokens=n,
        block_size=8,
        sampling=sp,
    )
    assert r.tokens == [t for t, _ in direct]
    assert r.spec.cycles > 0 and r.spec.drafted > 0
    again = run_spec(target, prompt, DFlashDrafter(draft, target), n, 8, 2048, sp)
    assert again.tokens == r.tokens
    greedy = run_spec(target, prompt, DFlashDrafter(draft, target), n, 8, 2048)
    assert greedy.tokens != r.tokens


def test_pool_stats_sums_counts_before_ratios():
    a, b = SpecStats(4), SpecStats(4)
    a.record(drafted=3, accepted=3, emitted=4)
    b.record(drafted=3, accepted=0, emitted=1)
    b.record(drafted=3, accepted=1, emitted=2)
    p = pool_stats([a, b])
    assert p["runs"] == 2 and p["cycles"] == 3
    # Pooled, not the mean of the runs' τ (4.0 and 1.5); as_dict rounds to 1e-4.
    assert p["tau"] == pytest.approx((4 + 1 + 2) / 3, abs=1e-4)
    assert p["acceptance_rate"] == pytest.approx(4 / 9, abs=1e-4)
    assert p["draft_share"] == pytest.approx(4 / 7, abs=1e-4)
    assert p["per_position_acceptance"] == pytest.approx(
        [2 / 3, 1 / 3, 1 / 3], abs=1e-4
    )
    assert (p["accepted_at"], p["drafted_at"]) == ([2, 1, 1], [3, 3, 3])

    # What a result JSON holds reads back into the same counts.
    back = SpecStats.from_dict(p)
    assert back == SpecStats(4).merge(a).merge(b)


def test_run_case_per_temperature_and_writers(tmp_path):
    target = _target()
    draft = _dflash(target)
    arms = [
        Arm("dflash", lambda ref: DFlashDrafter(draft, target), 8),
        Arm("lookup", lambda ref: PromptLookupDrafter(), 8),
    ]
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 2
    cases = [
        run_case(
            target,
            Case("code", "tiny", prompt, 16, SamplingParams(temperature=t, seed=1)),
            arms,
            repeats=2,
            cooldown=0.0,
            profile=False,
        )
        for t in (0.0, 0.7)
    ]
    greedy, sampled = cases
    assert greedy["sampling"]["temperature"] == 0.0 and greedy["baseline_deterministic"]
    assert sampled["sampling"] == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "seed": 1,
    }
    assert sampled["baseline_deterministic"] is None
    for name in ("dflash", "lookup"):
        g, s = greedy["arms"][name], sampled["arms"][name]
        assert g["token_match"]["equal_pct"] == 100.0  # greedy stays lossless
        assert s["token_match"] is None  # different samples: no match claimed
        for a in (g, s):
            assert a["spec"]["runs"] == 2 and a["tau_per_run"]["n"] == 2
            assert 1.0 <= a["spec"]["tau"] <= 8.0
            assert (
                a["tau_per_run"]["min"] <= a["spec"]["tau"] <= a["tau_per_run"]["max"]
            )
            assert all("tau" in r for r in a["per_run"])

    results = {
        "title": "tiny sampled",
        "settings": {"temp": [0.0, 0.7]},
        "environment": report.environment(),
        "cases": cases,
    }
    by_t = report.by_temperature(results)
    assert [(r["temperature"], r["decoder"]) for r in by_t] == [
        (0.0, "mlx_lm (stock)"),
        (0.0, "dflash"),
        (0.0, "lookup"),
        (0.7, "mlx_lm (stock)"),
        (0.7, "dflash"),
        (0.7, "lookup"),
    ]
    row = by_t[4]
    # One case: the same pool as the case's own (which is rounded to 1e-4).
    assert row["tau"] == pytest.approx(
        sampled["arms"]["dflash"]["spec"]["tau"], abs=1e-4
    )
    assert row["token_match_pct"] is None and by_t[1]["token_match_pct"] == 100.0
    assert row["speedup"]["n"] == 2

    js, md, png = report.write(results, tmp_path / "s", "mlx-dflash bench --temp 0,0.7")
    assert len(json.loads(js.read_text())["by_temperature"]) == 6
    text = md.read_text()
    assert "## By temperature" in text and report.SAMPLED in text
    lines = text.splitlines()
    sampled_rows = [l for l in lines if l.startswith("| code/tiny (16+16) T=0.7 |")]
    assert len(sampled_rows) == 3
    assert all(report.SAMPLED in l for l in sampled_rows[1:])
    assert all(l.count("|") == len(report.HEADER) + 1 for l in sampled_rows)
    t_rows = [l for l in lines if l.startswith("| 0.7 |")]
    assert len(t_rows) == 3
    assert all(l.count("|") == len(report.BY_TEMP_HEADER) + 1 for l in t_rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_temperatures_end_to_end(tmp_path, capsys):
    cli.main(
        [
            "--shape",
            "tiny-qwen3",
            "--dtype",
            "float32",
            "--draft",
            "lookup",
            "--temp",
            "0,1.0",
            "--top-k",
            "50",
            "--seed",
            "2",
            "--suites",
            "code",
            "--prompts-per-suite",
            "1",
            "--max-tokens",
            "8",
            "--repeats",
            "1",
            "--cooldown",
            "0",
            "--block-size",
            "4",
            "--no-profile",
            "--no-png",
            "--out",
            str(tmp_path / "cli"),
        ]
    )
    res = json.loads((tmp_path / "cli.json").read_text())
    temps = [c["sampling"]["temperature"] for c in res["cases"]]
    assert temps == [0.0, 1.0]
    assert all(c["sampling"]["top_k"] == 50 for c in res["cases"])
    assert (
        res["settings"]["greedy"] is False
        and "make_sampler" in res["settings"]["baseline"]
    )
    assert {r["temperature"] for r in res["by_temperature"]} == {0.0, 1.0}
    head = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [h["temp"] for h in head] == [0.0, 1.0]


def test_cli_quantized_drafts_and_fallback(tmp_path):
    """`DIR@q8`/`DIR@q4` arms quantize the checkpoint, `@full` ignores its
    draft vocabulary; `--fallback` keeps outputs exact."""
    d = save_tiny_shape_draft(tmp_path / "draft")
    (Path(d) / "draft_vocab.json").write_text(json.dumps(list(range(0, 1024, 2))))
    cli.main(
        [
            "--shape",
            "tiny-qwen3",
            "--dtype",
            "float32",
            "--draft",
            f"{d},{d}@q8,{d}@q4,{d}@full,{d}@q4@full",
            "--fallback",
            "--suites",
            "code",
            "--prompts-per-suite",
            "1",
            "--max-tokens",
            "24",
            "--repeats",
            "1",
            "--cooldown",
            "0",
            "--no-profile",
            "--no-png",
            "--out",
            str(tmp_path / "q"),
        ]
    )
    res = json.loads((tmp_path / "q.json").read_text())
    arms = res["cases"][0]["arms"]
    names = [a for a in arms if a.startswith("draft")]
    assert names == ["draft", "draft@q8", "draft@q4", "draft@full", "draft@q4@full"]
    for name in names:
        assert arms[name]["token_match"]["equal_pct"] == 100.0


def test_cli_quantized_shape_target_and_engine_draft(tmp_path):
    """`--quantize` builds a 4-bit target of the shape (as mlx_lm.convert -q
    leaves one), `--draft-quantize` the engine arm's draft; both recorded, and
    the arm's output is the quantized target's own."""
    cli.main(
        "--shape tiny-qwen3 --peaked --dtype float32 --quantize 4 --group-size 64 "
        "--draft engine --draft-quantize 4 --tau 3 --suites code --prompts-per-suite 1 "
        "--max-tokens 12 --repeats 1 --cooldown 0 --block-size 4 --no-profile --no-png "
        f"--out {tmp_path / 'q'}".split()
    )
    res = json.loads((tmp_path / "q.json").read_text())
    s = res["settings"]
    assert (s["quantize"], s["group_size"], s["draft_quantize"]) == (4, 64, [4])
    assert "4-bit g64" in s["target"] and "4-bit draft" in s["target"]
    (arm,) = res["cases"][0]["arms"].values()
    assert arm["token_match"]["equal_pct"] == 100.0


def test_real_shape_presets_are_the_published_sizes():
    """Every real `--shape` preset builds its mlx_lm model (lazily: nothing is
    materialised) at the published size of its text model, and `--shape`
    offers the 27B."""
    from mlx.utils import tree_flatten

    from mlx_dflash.bench.shapes import lazy_target

    for name, billions in [("qwen3-8b", 8.19), ("qwen3.5-9b", 8.95), ("qwen3.6-27b", 26.90)]:
        model = lazy_target(name)
        n = sum(v.size for _, v in tree_flatten(model.parameters()))
        assert n / 1e9 == pytest.approx(billions, abs=0.01), name
    args = build_parser(argparse.ArgumentParser()).parse_args(["--shape", "qwen3.6-27b"])
    assert args.shape == "qwen3.6-27b"


def test_quantized_shape_is_built_layer_by_layer():
    """`--quantize` makes and quantizes a shape one layer at a time: the same
    values as quantizing the whole evaluated model, without ever holding the
    whole full-precision model (a 27B shape's would take 54 GB)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from mlx_dflash.bench.shapes import build_target

    mx.clear_cache()
    mx.reset_peak_memory()
    whole = build_target("smollm2-135m", peaked=True)
    nn.quantize(whole, group_size=64, bits=4)
    mx.eval(whole.parameters())
    peak_whole = mx.get_peak_memory()
    expected = dict(tree_flatten(whole.parameters()))
    del whole
    held = sum(v.nbytes for v in expected.values())
    mx.clear_cache()
    mx.reset_peak_memory()
    layered = build_target("smollm2-135m", peaked=True, quantize=4, group_size=64)
    peak_layered = mx.get_peak_memory() - held  # `expected` stays in memory
    got = dict(tree_flatten(layered.parameters()))
    assert got.keys() == expected.keys()
    assert all(mx.array_equal(got[k], expected[k]).item() for k in got)
    assert peak_layered < 0.8 * peak_whole, (peak_layered, peak_whole)


def test_cli_draft_quantize_list_runs_an_arm_per_choice(tmp_path):
    """`--draft-quantize none,4`: the engine arm once on the draft as built and
    once on its 4-bit copy, in the same run, each named so, both the target's
    own output; and an unknown choice is a one-line error."""
    cli.main(
        "--shape tiny-qwen3 --peaked --dtype float32 --draft engine "
        "--draft-quantize none,4 --tau 3 --suites code --prompts-per-suite 1 "
        "--max-tokens 12 --repeats 1 --cooldown 0 --block-size 4 --no-profile --no-png "
        f"--out {tmp_path / 'q'}".split()
    )
    res = json.loads((tmp_path / "q.json").read_text())
    assert res["settings"]["draft_quantize"] == [None, 4]
    arms = res["cases"][0]["arms"]
    assert list(arms) == ["engine τ=3 unquantized draft", "engine τ=3 4-bit draft"]
    for arm in arms.values():
        assert arm["token_match"]["equal_pct"] == 100.0
    # The second arm against the first, repeat by repeat.
    dense, packed = arms.values()
    paired = packed["paired"]
    ratio = packed["per_run"][0]["decode_tps"] / dense["per_run"][0]["decode_tps"]
    assert paired["against"] == "engine τ=3 unquantized draft" and "paired" not in dense
    assert paired["ratio"]["n"] == 1 and paired["ratio"]["median"] == pytest.approx(ratio)
    md = (tmp_path / "q.md").read_text()
    assert f"engine τ=3 4-bit draft / engine τ=3 unquantized draft: {ratio:.3f}" in md
    with pytest.raises(SystemExit):
        cli.main(["--draft-quantize", "3", "--draft", "lookup"])


def _engine_arms_per_choice(tmp_path, flag: str, choices: str, label: str):
    """A tiny engine-mode bench with `flag choices`: one arm per choice, named
    after it, each the target's own output."""
    cli.main(
        f"--shape tiny-qwen3 --peaked --dtype float32 --draft engine {flag} {choices} "
        "--tau 3 --suites code --prompts-per-suite 1 --max-tokens 12 --repeats 1 "
        f"--cooldown 0 --block-size 4 --no-profile --no-png --out {tmp_path / 'f'}".split()
    )
    arms = json.loads((tmp_path / "f.json").read_text())["cases"][0]["arms"]
    assert list(arms) == [f"engine τ=3 {label}={c}" for c in choices.split(",")]
    for arm in arms.values():
        assert arm["token_match"]["equal_pct"] == 100.0


def test_cli_draft_flush_list_runs_an_arm_per_choice(tmp_path, monkeypatch):
    """`--draft-flush 0,1`: the engine arm once per choice in the same run,
    each drafter made with its choice, both the target's own output; and a
    choice that is not a layer count is a one-line error."""
    from mlx_dflash.drafters import DFlashDrafter

    made = []
    init = DFlashDrafter.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self.flush_every)

    monkeypatch.setattr(DFlashDrafter, "__init__", spy)
    _engine_arms_per_choice(tmp_path, "--draft-flush", "0,1", "draft flush")
    assert {0, 1} <= set(made)
    with pytest.raises(SystemExit):
        cli.main(["--draft-flush", "x,1", "--shape", "tiny-qwen3", "--draft", "engine"])


def test_cli_verify_flush_list_runs_an_arm_per_choice(tmp_path, monkeypatch):
    """`--verify-flush 0,2@1`: the engine arm once per choice, each run with
    its schedule set on the target, both the target's own output; a choice
    that is not E or E@F is a one-line error."""
    from mlx_dflash.target import Target

    seen = []
    setter = Target.set_verify_flush

    def spy(self, every=None, first=None):
        setter(self, every, first)
        seen.append((every, first))

    monkeypatch.setattr(Target, "set_verify_flush", spy)
    _engine_arms_per_choice(tmp_path, "--verify-flush", "0,2@1", "verify flush")
    assert {(0, None), (2, 1)} <= set(seen)
    for bad in ("x", "2@y", "2@", "0@2"):
        with pytest.raises(SystemExit, match="--verify-flush"):
            cli.main(["--verify-flush", bad, "--shape", "tiny-qwen3", "--draft", "engine"])


def test_cli_quantize_needs_a_shape(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--quantize", "4", "--draft", "lookup"])
    assert "--quantize needs --shape" in capsys.readouterr().err


def test_shape_too_large_for_the_device_is_refused_before_building(capsys, monkeypatch):
    """A shape whose weights alone exceed the memory available is a one-line
    error naming the shape and both sizes, before anything is allocated; the
    size it predicts is what the built model takes, dense and 4-bit."""
    from mlx.utils import tree_flatten

    from mlx_dflash.bench import shapes

    for bits in (None, 4):
        lazy = shapes.lazy_target("tiny-qwen3.5")
        built = shapes.build_target("tiny-qwen3.5", quantize=bits)
        assert shapes.weight_bytes(lazy, bits, 64) == sum(
            v.nbytes for _, v in tree_flatten(built.parameters())
        )
    monkeypatch.setattr(shapes, "available_memory", lambda info, where: 10**9)
    before = mx.get_active_memory()
    with pytest.raises(SystemExit):
        cli.main("--shape qwen3.6-27b --quantize 4 --draft engine --no-png".split())
    err = capsys.readouterr().err
    assert "--shape qwen3.6-27b at 4 bits: its weights alone take ~15.13 GB" in err
    assert "1.00 GB is available" in err and len(err.strip().splitlines()) == 1
    assert mx.get_active_memory() - before < 10**8
    with pytest.raises(ValueError, match="5-layer random draft: its weights alone take ~3.46 GB"):
        shapes.build_draft("qwen3.6-27b", 64)


def _case(suite, prompt, n, temp, arms):
    stat = lambda v: {"median": v, "min": v, "max": v}
    return {
        "suite": suite,
        "name": f"{suite}-0",
        "prompt_tokens": prompt,
        "max_tokens": n,
        "sampling": {"temperature": temp},
        "baseline": {"decode_tps": stat(10.0)},
        "arms": {
            a: {
                "decode_tps": stat(20.0),
                "speedup": stat(2.0),
                "spec": {"tau": 3.0, "per_position_acceptance": [0.8, 0.5]},
                "tau_per_run": stat(3.0),
            }
            for a in arms
        },
    }


def test_png_draws_only_panels_the_run_varies(tmp_path):
    """One length and one temperature: speeds beside stock and acceptance
    only; lengths, temperatures and a suite's context sweep add their panels."""
    from mlx_dflash.bench import plot

    def panels(cases):
        temps = sorted({c["sampling"]["temperature"] for c in cases})
        rows = [
            {"temperature": t, "decoder": a, "tau": 3.0,
             "tau_per_run": {"median": 3.0, "min": 2.5, "max": 3.5}}
            for t in temps for a in ("a", "b")
        ]
        results = {"title": "t", "cases": cases, "by_temperature": rows}
        chosen = [p.__name__ for p in plot.PANELS if p.applies(results)]
        plot.plot(results, tmp_path / "p.png")  # draws without error
        return chosen

    one = [_case("code", 70, 64, 0.0, ["a", "b"]), _case("chat", 56, 64, 0.0, ["a", "b"])]
    assert panels(one) == ["Speeds", "Acceptance"]
    varied = one + [_case("code", 900, 128, 1.0, ["a", "b"])]
    assert panels(varied) == ["Speeds", "Acceptance", "Lengths", "Contexts", "Temperatures"]


def test_cli_warm_up_warms_every_speculative_arm_first(tmp_path, monkeypatch):
    """`--warm-up` runs `serve`'s warm-up on each speculative arm (with every
    --temp setting) before the first case, and the runs still match stock."""
    calls = []
    real = cli.warm_up

    def spy(target, drafter, block, settings, **kw):
        calls.append((type(drafter).__name__, block, [s.temperature for s in settings]))
        return real(target, drafter, block, settings, **kw)

    monkeypatch.setattr(cli, "warm_up", spy)
    cli.main(
        "--shape tiny-qwen3 --peaked --dtype float32 --draft engine,lookup --warm-up "
        "--tau 3 --temp 1.0,0 --suites code --prompts-per-suite 1 --max-tokens 12 "
        "--repeats 1 --cooldown 0 --block-size 4 --no-profile --no-png "
        f"--out {tmp_path / 'w'}".split()
    )
    assert calls == [("EngineDrafter", 4, [1.0, 0.0]), ("PromptLookupDrafter", 4, [1.0, 0.0])]
    res = json.loads((tmp_path / "w.json").read_text())
    assert res["settings"]["warm_up"] is True
    greedy = [c for c in res["cases"] if c["sampling"]["temperature"] == 0.0]
    for arm in greedy[0]["arms"].values():
        assert arm["token_match"]["equal_pct"] == 100.0


def test_cli_concurrency_three_ways(tmp_path, capsys):
    """`--concurrency`: stock BatchGenerator, our one-at-a-time loop and our
    batched verify on the same C prompts, every stream checked against stock."""
    cli.main(
        ["--shape", "tiny-qwen3", "--dtype", "float32", "--peaked"]
        + ["--draft", "lookup", "--suites", "code", "--prompts-per-suite", "2"]
        + ["--max-tokens", "10", "--repeats", "1", "--cooldown", "0"]
        + ["--block-size", "4", "--concurrency", "1,3", "--out", str(tmp_path / "c")]
    )
    res = json.loads((tmp_path / "c.json").read_text())
    assert [r["concurrency"] for r in res["concurrency"]] == [1, 3]
    for r in res["concurrency"]:
        assert set(r["ways"]) == {"mlx_lm batch", "lookup fifo", "lookup batch"}
        for w in r["ways"].values():
            assert w["exact"] and w["aggregate_tps"] > 0
            streams = r["concurrency"]
            assert len(w["ttft_s"]) == len(w["per_stream_decode_tps"]) == streams
    md = (tmp_path / "c.md").read_text()
    assert "| 3 | lookup batch |" in md and "| aggregate / one stream |" in md
    one = next(l for l in md.splitlines() if l.startswith("| 1 | lookup batch |"))
    assert one.count(" 1.00× ") == 2  # against itself
    assert "lookup batch" in capsys.readouterr().out
