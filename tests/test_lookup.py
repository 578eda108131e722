"""Prompt lookup: the n-gram index against a brute-force search, and a DFlash
drafter assisted by it still giving the target's own output (greedy token for
token, sampled in distribution), and through a saved state (batched rows:
test_batch.py)."""

import copy
import json
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import PROMPT, chi2_pvalue, exact_joint, random_dflash, run, run_cli
from helpers import sample_counts, setup, small_drafter, small_vocab_model
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_dflash import load
from mlx_dflash.bench.arms import checkpoint_options
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import DFlashDrafter
from mlx_dflash.lookup import LookupAssist, NgramIndex
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.target import Target


def brute(tokens, anchor, count, lo, hi):
    """The search the index replaces: longest tail first, latest occurrence."""
    seq = tokens + [anchor]
    for n in range(min(hi, len(seq) - 1), lo - 1, -1):
        tail = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == tail:
                return seq[i + n : i + n + count], n
    return [], 0


ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.lists(st.integers(0, 3), max_size=12)),
        st.tuples(st.just("trim"), st.integers(0, 6)),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(0, 3), st.integers(1, 8), st.integers(1, 4))
def test_index_equals_brute_force(steps, anchor, count, lo):
    index, tokens = NgramIndex(4), []
    for op, arg in steps:
        if op == "extend":
            index.extend(arg)
            tokens += arg
        else:
            index.trim(arg)
            del tokens[max(0, len(tokens) - arg) :]
        assert index.tokens == tokens
        assert index.continuation(anchor, count, lo) == brute(tokens, anchor, count, lo, 4)
    # Trimming everything leaves no n-gram behind.
    index.trim(len(tokens))
    assert index.ends == {}


def test_merge_takes_the_continuation_where_it_agrees():
    index = NgramIndex(4)
    index.extend([7, 1, 2, 3, 4, 9, 7])  # anchor 1 after 7: "7 1" recurs, then 2 3 4 9 7
    agree = mx.array([2, 5, 5, 5, 5, 5], mx.uint32)
    differ = mx.array([6, 5, 5, 5, 5, 5], mx.uint32)
    assist = LookupAssist(trust=None)
    assert assist.merge(index, 1, agree)[0].tolist() == [2, 3, 4, 9, 7, 1]
    assert assist.merge(index, 1, differ)[0].tolist() == differ.tolist()
    # A two-token tail is trusted at trust=2, whatever the first draft says.
    assert LookupAssist(trust=2).merge(index, 1, differ)[0].tolist() == [2, 3, 4, 9, 7, 1]
    # A longer block keeps its own drafts after the continuation's end.
    long = mx.array([2] + [5] * 9, mx.uint32)
    assert assist.merge(index, 1, long)[0].tolist() == [2, 3, 4, 9, 7, 1, 5, 5, 5, 5]
    # Nothing recurs: the drafts as they were.
    assert assist.merge(index, 8, agree)[0].tolist() == agree.tolist()


def test_merge_gives_continuation_tokens_point_masses_and_keeps_the_first_draw():
    index = NgramIndex(4)
    index.extend([3, 1, 2, 0])
    q = mx.log(mx.full((3, 4), 0.25))
    draft = mx.array([1, 0, 0], mx.uint32)  # agrees with the continuation 1 2 0
    merged, q2 = LookupAssist(trust=None).merge(index, 3, draft, q)
    assert merged.tolist() == [1, 2, 0]
    assert mx.allclose(q2[0], q[0]).item()  # the first token was drawn from q
    assert q2[1].tolist() == [-float("inf"), -float("inf"), 0.0, -float("inf")]
    trusted, q3 = LookupAssist(trust=1).merge(index, 3, mx.array([0, 0, 0], mx.uint32), q)
    assert trusted.tolist() == [1, 2, 0]
    assert q3[0].tolist() == [-float("inf"), 0.0, -float("inf"), -float("inf")]


def assisted(target, trust=None):
    d = random_dflash(target)
    return DFlashDrafter(d.draft, target, lookup=LookupAssist(trust=trust))


@pytest.mark.parametrize("family", ["llama", "qwen3_5", "qwen3_moe"])
@pytest.mark.parametrize("trust", [None, 1])
def test_assisted_greedy_equals_stock(family, trust):
    model, ref = setup(family)
    target = Target(model)
    for block in (4, 16):
        out, _ = run(target, assisted(target, trust), max_tokens=len(ref), block_size=block)
        assert out == ref


def test_trusted_continuations_are_drafted_and_accepted():
    # This seeded tiny llama falls into a loop that lookup predicts, which its
    # random drafter alone never does.
    model, ref = setup("llama")
    target = Target(model)
    _, alone = run(target, random_dflash(target), max_tokens=len(ref), block_size=8)
    out, helped = run(target, assisted(target, 1), max_tokens=len(ref), block_size=8)
    assert out == ref
    assert alone.accepted == 0 < helped.accepted


def test_state_round_trip_rebuilds_the_index():
    model, _ = setup("llama")
    target = Target(model)
    d = assisted(target)
    out = [t for t, _ in generate_step(target, PROMPT, d, max_tokens=9, block_size=4)]
    held = PROMPT + out[:-1]  # what the caches hold after the run
    assert d.index.tokens == held
    saved = copy.deepcopy(d.state())
    d.trim(3)
    assert d.index.tokens == held[:-3]
    d.load_state(saved)
    assert d.index.tokens == held
    with pytest.raises(ValueError, match="tokens"):
        d.load_state({"cache": saved["cache"]})


def test_auto_turns_the_lookup_on_for_the_shipped_drafter_only(draft_dir, monkeypatch):
    from models import tiny_model

    target = Target(tiny_model("qwen3"))
    assert load.make_drafter(draft_dir, target)[0].lookup is None
    assert load.make_drafter(draft_dir, target, lookup="on")[0].lookup == LookupAssist()
    assert load.make_drafter(draft_dir, target, lookup="2")[0].lookup == LookupAssist(2, trust=None)
    monkeypatch.setattr(load, "DEFAULT_DRAFT", Path(draft_dir))
    assert load.make_drafter(None, target)[0].lookup == LookupAssist()
    assert load.make_drafter(None, target, lookup="off")[0].lookup is None


def test_generate_reports_the_lookup_and_keeps_the_text(model_dir, draft_dir):
    base = ("generate", "--model", str(model_dir), "--draft", draft_dir)
    base += ("--prompt", "a b a b a b a b", "--max-tokens", "16", "--json")
    results = {}
    for flag in ("off", "on", "1:2"):
        proc = run_cli(*base, "--prompt-lookup", flag)
        assert proc.returncode == 0, proc.stderr
        results[flag] = json.loads(proc.stdout)
    assert results["off"]["prompt_lookup"] is None
    assert results["on"]["prompt_lookup"] == {"min_match": 1, "max_match": 4, "trust": 3}
    assert results["1:2"]["prompt_lookup"]["trust"] == 2
    assert len({r["text"] for r in results.values()}) == 1


def test_bench_checkpoint_suffixes():
    assert checkpoint_options("d") == ("d", {})
    assert checkpoint_options("d@q4@full@nolookup") == (
        "d",
        {"quantize": 4, "vocab": "all", "lookup": "off"},
    )
    with pytest.raises(SystemExit, match="unknown suffix @q5"):
        checkpoint_options("d@q5")


@pytest.mark.slow
@pytest.mark.parametrize("trust", [None, 1])
def test_assisted_sampling_matches_target(trust):
    model = small_vocab_model()
    target = Target(model)
    d = small_drafter(target)
    drafter = DFlashDrafter(d.draft, target, lookup=LookupAssist(trust=trust))
    params = SamplingParams(temperature=1.0)
    counts = sample_counts(target, drafter, params, 10_000)
    assert chi2_pvalue(counts, exact_joint(model, params)) > 0.01
