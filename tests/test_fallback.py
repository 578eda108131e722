"""Acceptance-collapse fallback: plain decoding while speculation does not pay; still exact."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from models import VOCAB, tiny_model

from mlx_dflash.decode import Fallback, SpecStats, generate_step
from mlx_dflash.drafters import OracleDrafter
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
