"""Bench: statistics, acceptance definitions, report writers, a tiny end-to-end run."""

import json
import struct

import mlx.core as mx
import pytest
from models import VOCAB, tiny_model

from mlx_dflash.bench import report
from mlx_dflash.bench.engine import (
    EngineDrafter,
    geometric_p,
    geometric_schedule,
    make_engine_drafter,
)
from mlx_dflash.bench.runner import Arm, Case, run_case
from mlx_dflash.bench.shapes import draft_for_target
from mlx_dflash.bench.stats import ideal_speedup, run_order, summarize, token_match
from mlx_dflash.bench.suites import SUITES, load_suite, suite_prompts
from mlx_dflash.decode import SpecStats, generate_step
from mlx_dflash.drafters import PromptLookupDrafter
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
