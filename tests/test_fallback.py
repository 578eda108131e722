"""Acceptance-collapse fallback: plain decoding while speculation does not pay; still exact."""

import time

import mlx.core as mx
import numpy as np
import helpers as h
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from models import VOCAB, save_tiny_shape_draft, tiny_model

from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import OracleDrafter
from mlx_dflash.fallback import Fallback
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target

PROMPT = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_fallback_switches_when_acceptance_collapses(family):
    model = tiny_model(family)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=160)]
    # Perfect drafts for 4 cycles, then every draft wrong from the first token on.
    drafter = OracleDrafter(
        PROMPT + ref, vocab_size=VOCAB, schedule=[99] * 4 + [0] * 1000
    )
    stats = SpecStats(16)
    fallback = Fallback(window=2, plain_tokens=8, max_plain=32, break_even=2.0)
    out = [
        t
        for t, _ in generate_step(
            Target(model),
            PROMPT,
            drafter,
            max_tokens=160,
            fallback=fallback,
            stats=stats,
        )
    ]
    assert out == ref
    assert stats.fallbacks >= 2  # fell back, probed, fell back again
    assert stats.plain_tokens > 60
    # Probes never exceed `window` cycles between plain stretches.
    assert stats.cycles <= 4 + 2 * (stats.fallbacks + 1)


def test_no_fallback_while_speculation_pays():
    model = tiny_model("qwen3")
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=80)]
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB)
    stats = SpecStats(16)
    out = [
        t
        for t, _ in generate_step(
            Target(model),
            PROMPT,
            drafter,
            max_tokens=80,
            fallback=Fallback(window=2, break_even=2.0),
            stats=stats,
        )
    ]
    assert out == ref
    assert stats.fallbacks == 0 and stats.plain_tokens == 0


def test_measured_break_even_stays_exact():
    """Timing-driven decisions (the default) change speed, never tokens."""
    model = tiny_model("qwen3_5_moe")
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=60)]
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB, error_rate=0.5, seed=3)
    stats = SpecStats(16)
    out = [
        t
        for t, _ in generate_step(
            Target(model),
            PROMPT,
            drafter,
            max_tokens=60,
            fallback=Fallback(window=2),
            stats=stats,
        )
    ]
    assert out == ref
    assert stats.emitted + stats.plain_tokens == 59


# ---- the policy: cheap probes, exponential backoff, block grown on success --------

N = 160
FIXED = dict(break_even=2.0, window=2)  # deterministic decisions (no timings)


class ShiftingOracle(OracleDrafter):
    """The target's own continuation, except that drafts for sequence positions
    in `wrong` are wrong with probability `rate` (the acceptance jumps there)."""

    def __init__(self, reference, wrong: range, rate: float = 1.0, seed: int = 0):
        super().__init__(reference, vocab_size=VOCAB, seed=seed)
        self.wrong, self.rate = wrong, rate

    def propose(self, anchor, n):
        pos = self.length + 1  # position of the first drafted token
        draft = [
            self._wrong(t) if p in self.wrong and self.rng.random() < self.rate else t
            for p, t in enumerate(self.reference[pos : pos + n], start=pos)
        ]
        return mx.array(draft, dtype=mx.uint32)


def log_steps(target, drafter):
    """Record, on these instances only, ("verify", tokens) for every decode
    forward and ("draft", n) for every proposal, in call order."""
    events = []
    forward, propose = target.forward, drafter.propose

    def spy_forward(tokens, cache, *, last_only=False, **kw):
        if not last_only:  # prefill asks for its last row only
            events.append(("verify", tokens.shape[1]))
        return forward(tokens, cache, last_only=last_only, **kw)

    def spy_propose(anchor, n):
        events.append(("draft", n))
        return propose(anchor, n)

    target.forward, drafter.propose = spy_forward, spy_propose
    return events


def decode(model, drafter, fallback, max_tokens=N, **kw):
    target = Target(model)
    events = log_steps(target, drafter)
    stats = SpecStats(16)
    out = [
        t
        for t, _ in generate_step(
            target,
            PROMPT,
            drafter,
            max_tokens=max_tokens,
            fallback=fallback,
            stats=stats,
            **kw,
        )
    ]
    return out, stats, events


_refs = {}


def setup(family):
    if family not in _refs:
        model = tiny_model(family)
        ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
        _refs[family] = model, ref
    return _refs[family]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_collapse_probes_without_verifying_and_backs_off(family):
    model, ref = setup(family)
    P = len(PROMPT)
    drafter = ShiftingOracle(PROMPT + ref, wrong=range(P + 40, P + N))
    out, stats, events = decode(model, drafter, Fallback(**FIXED))
    assert out == ref
    sizes = [n for kind, n in events if kind == "verify"]
    first_plain = sizes.index(1)
    # Speculation starts with 4-token blocks and grows to 16 while drafts are right.
    assert sizes[:3] == [4, 8, 16]
    # After the collapse no cycle verifies drafts any more, let alone a full
    # block: only plain 1-token steps, some of which also drafted a probe.
    assert set(sizes[first_plain:]) == {1}
    assert sizes.count(1) == stats.plain_tokens
    probes = [n for kind, n in events[events.index(("verify", 1)) :] if kind == "draft"]
    assert probes == [3] * stats.probes and stats.probes >= 3
    # Every probe failed, so each began a plain stretch twice as long as the last.
    assert stats.fallbacks == stats.probes + 1
    stretches, run = [], 0
    for kind, n in events[events.index(("verify", 1)) :]:
        if kind == "draft":
            stretches.append(run + 1)  # the probe step ends its stretch
            run = -1
        else:
            run += 1
    assert stretches == [8, 16, 32, 64][: len(stretches)]
    # The drafter received every plain step's token (its context stays whole).
    assert drafter.length == len(PROMPT) + len(out) - 1


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5_moe"])
def test_probe_resumes_speculation_after_recovery(family):
    model, ref = setup(family)
    P = len(PROMPT)
    drafter = ShiftingOracle(PROMPT + ref, wrong=range(P + 30, P + 60))
    out, stats, events = decode(model, drafter, Fallback(**FIXED))
    assert out == ref
    sizes = [n for kind, n in events if kind == "verify"]
    last_plain = len(sizes) - 1 - sizes[::-1].index(1)
    # A probe hit: speculation resumed at the probe block and grew again.
    assert sizes[last_plain + 1 : last_plain + 4] == [4, 8, 16]
    assert stats.emitted > N // 2 and 0 < stats.plain_tokens < 60


def test_timed_decisions_exact_and_stats_split_by_mode():
    """The default (timing-based) policy with acceptance that jumps from
    perfect to 90% wrong mid-generation: output identical to stock greedy,
    tokens and seconds reported per mode."""
    model, ref = setup("qwen3_5")
    P = len(PROMPT)
    drafter = ShiftingOracle(PROMPT + ref, wrong=range(P + 50, P + N), rate=0.9)
    tic = time.perf_counter()
    out, stats, events = decode(model, drafter, Fallback())
    wall = time.perf_counter() - tic
    assert out == ref
    # Step 1 is plain (it measures a plain step), step 2 a probe, which hits.
    assert events[:4] == [("verify", 1), ("draft", 3), ("verify", 1), ("draft", 3)]
    assert events[4] == ("verify", 4)
    assert stats.plain_tokens >= 2 and stats.emitted > 0
    assert stats.plain_tokens + stats.emitted == N - 1
    assert stats.plain_seconds > 0 and stats.spec_seconds > 0
    assert stats.plain_seconds + stats.spec_seconds < wall
    d = stats.as_dict()["fallback"]
    assert d["plain_tokens"] == stats.plain_tokens
    assert d["speculative_tokens"] == stats.emitted
    assert d["probes"] == stats.probes >= 1
    assert d["plain_stretches"] == stats.fallbacks


@pytest.mark.slow
def test_sampling_with_fallback_is_distributed_as_the_target():
    """Spec cycles, plain steps and probes mixed within the first three
    tokens still sample the target's joint distribution exactly."""
    model = h.small_vocab_model()
    target = Target(model)
    drafter = h.small_drafter(target)
    params = SamplingParams(temperature=1.0)
    # 1-draft cycles; one token below break-even -> a 1-step stretch, a probe.
    fallback = Fallback(probe_block=2, window=1, plain_tokens=1, break_even=2.0)
    counts = np.zeros(h.SMALL_V**3)
    modes = np.zeros(2)
    for s in range(5_000):
        stats = SpecStats(3)
        out = [
            t
            for t, _ in generate_step(
                target,
                h.SMALL_PROMPT,
                drafter,
                max_tokens=3,
                block_size=3,
                sampling=SamplingParams(temperature=1.0, seed=s),
                fallback=fallback,
                stats=stats,
            )
        ]
        counts[(out[0] * h.SMALL_V + out[1]) * h.SMALL_V + out[2]] += 1
        modes += [stats.plain_tokens > 0, stats.emitted > 0]
    assert modes.min() > 500  # both modes are well represented
    assert h.chi2_pvalue(counts, h.exact_joint(model, params)) > 0.01


def test_bad_settings():
    with pytest.raises(ValueError, match="probe_block"):
        Fallback(probe_block=1)
    with pytest.raises(ValueError, match="plain_tokens"):
        Fallback(plain_tokens=64, max_plain=32)


def test_bench_reports_time_per_mode(tmp_path):
    """`bench --fallback`: outputs still match stock; the report splits tokens
    and seconds by mode."""
    import json

    from mlx_dflash.bench import cli

    draft = save_tiny_shape_draft(tmp_path / "draft")
    out = str(tmp_path / "fb")
    # fmt: off
    cli.main([
        "--shape", "tiny-qwen3", "--dtype", "float32", "--draft", draft,
        "--fallback", "--suites", "code", "--prompts-per-suite", "1",
        "--max-tokens", "24", "--repeats", "1", "--cooldown", "0", "--no-profile",
        "--no-png", "--out", out,
    ])
    # fmt: on
    arm = json.loads(open(out + ".json").read())["cases"][0]["arms"]["draft"]
    assert arm["token_match"]["equal_pct"] == 100.0
    f = arm["spec"]["fallback"]
    # Every decoded token (the first comes from the prefill) is in one mode;
    # timed decisions always decode the first step plainly.
    assert f["plain_tokens"] + f["speculative_tokens"] == 23 * arm["spec"]["runs"]
    assert f["plain_tokens"] > 0 and f["plain_seconds"] > 0
    md = open(out + ".md").read()
    assert "## Fallback: tokens and seconds per mode" in md
