"""Batched verify (batch.py): every row's output is its solo output.

Rows of mixed prompt lengths, max_tokens, block sizes and acceptance lengths
verified in one target forward per cycle, joining late and leaving early,
return exactly stock mlx_lm's greedy tokens (which the one-row path equals,
test_decode.py); their caches after rollback equal the one-row autoregressive
caches; sampled rows make the one-row run's draws for the same seed and are
distributed as the target.
"""

import dataclasses
import random

import mlx.core as mx
import numpy as np
import pytest
from helpers import (
    SMALL_PROMPT,
    SMALL_V,
    chi2_pvalue,
    exact_joint,
    random_dflash,
    small_drafter,
    small_vocab_model,
)
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache
from models import VOCAB, tiny_model

from mlx_dflash.batch import WAIT, Batch
from mlx_dflash.decode import generate_step, prefill
from mlx_dflash.draft import DFlashDraft
from mlx_dflash.lookup import LookupAssist
from mlx_dflash.drafters import (
    DFlashDrafter,
    OracleDrafter,
    PromptLookupDrafter,
    precommit,
    prefetch,
)
from mlx_dflash.fallback import Fallback
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target

FAMILIES = ["llama", "qwen3_5", "qwen3_5_moe", "qwen3_moe"]
_models = {}


def model_of(family):
    if family not in _models:
        _models[family] = tiny_model(family)
    return _models[family]


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(1, VOCAB - 1) for _ in range(n)]


def stock(model, p, n):
    return [t for t, _ in stock_generate_step(mx.array(p), model, max_tokens=n)]


def drive(batch, joins, leave_at=None):
    """Run `batch` to the end. `joins`: {cycle: [(tag, prompt, drafter, options)]},
    joined before that cycle; `leave_at`: {tag: cycle}, the row is let go
    after that many cycles. Returns ({tag: tokens}, {tag: caches of rows let go})."""
    leave_at = leave_at or {}
    out, left, rows, cycle = {}, {}, {}, 0
    while True:
        for tag, p, drafter, opts in joins.get(cycle, []):
            row, first = batch.join(p, drafter, tag=tag, **opts)
            rows[tag], out[tag] = row, [first[0]]
        for tag, at in leave_at.items():
            if at == cycle and rows[tag] in batch.rows:
                left[tag] = batch.leave(rows[tag])
        if not batch.rows and cycle >= max(joins):
            return out, left
        if batch.rows:
            for row, toks in batch.step():
                out[row.tag] += [t for t, *_ in toks]
        cycle += 1


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_return_their_solo_greedy_output(family):
    model = model_of(family)
    target = Target(model)
    # tag: (prompt, max_tokens, block size, oracle schedule: the first wrong
    # draft of each cycle)
    plan = {
        "a": (prompt(1, 8), 40, 16, [0, 3, 7, 1, 14, 2, 9]),
        "b": (prompt(2, 21), 23, 16, [5]),
        "c": (prompt(3, 3), 48, 16, None),  # all drafts right; a stop inside a block
        "d": (prompt(4, 11), 48, 4, [1, 0, 2]),  # let go after 2 cycles
        "e": (prompt(5, 14), 30, 16, [2, 15]),  # joins after 3 cycles
        "f": (prompt(6, 5), 1, 16, [0]),  # done at its first token: never joins
    }
    refs = {t: stock(model, p, n) for t, (p, n, _, _) in plan.items()}
    rc = refs["c"]
    k = next(i for i in range(5, len(rc)) if rc[i] not in rc[:i])
    joins = {0: [], 3: []}
    for tag, (p, n, block, schedule) in plan.items():
        drafter = OracleDrafter(p + refs[tag], vocab_size=VOCAB, schedule=schedule)
        opts = dict(max_tokens=n, block_size=block)
        if tag == "c":
            opts["stop_tokens"] = [rc[k]]
        joins[3 if tag == "e" else 0].append((tag, p, drafter, opts))
    out, left = drive(Batch(target), joins, leave_at={"d": 2})
    for tag in "abef":
        assert out[tag] == refs[tag], tag
    assert out["c"] == rc[: k + 1]
    assert 2 < len(out["d"]) < 48 and out["d"] == refs["d"][: len(out["d"])]
    assert set(left) == {"d"}


def autoregressive_cache(model, p, tokens):
    """The cache stock mlx_lm builds: prompt in one pass, then one token at a time."""
    cache = make_prompt_cache(model)
    model(mx.array([p]), cache=cache)
    for t in tokens:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_caches_after_rollback_equal_autoregressive(family):
    model = model_of(family)
    target = Target(model)
    prompts = [prompt(7, 9), prompt(8, 26), prompt(9, 2)]
    schedules = [[0, 3, 7, 1, 14, 2, 9], [5], [15, 0, 2]]
    joins = {0: []}
    for i, (p, s) in enumerate(zip(prompts, schedules)):
        drafter = OracleDrafter(p + stock(model, p, 60), vocab_size=VOCAB, schedule=s)
        joins[0].append((i, p, drafter, dict(max_tokens=60)))
    out, left = drive(Batch(target), joins, leave_at={0: 4, 1: 4, 2: 4})
    for i, p in enumerate(prompts):
        ref = autoregressive_cache(model, p, out[i][:-1])
        for j, (a, b) in enumerate(zip(left[i], ref)):
            assert type(a) is type(b), j
            if isinstance(b, KVCache):
                assert a.offset == b.offset == len(p) + len(out[i]) - 1
                for x, y in zip(a.state[:2], b.state[:2]):
                    x = np.array(x[..., : a.offset, :])
                    y = np.array(y[..., : b.offset, :])
                    assert np.array_equal(x, y), (i, j)  # difference 0
            else:
                assert isinstance(b, ArraysCache)
                for x, y in zip(a.cache, b.cache):
                    assert x.shape == y.shape and x.dtype == y.dtype
                    assert np.array_equal(np.array(x), np.array(y)), (i, j)


def cooperate(batch, gens, close_after):
    """Drive `Batch.steps` generators as a server would: each runs until it
    waits, then one batched cycle. `close_after`: {tag: n} closes that one
    after its n-th token (a client gone mid-cycle)."""
    out = {tag: [] for tag in gens}
    live = dict(gens)
    while live:
        for tag, steps in list(live.items()):
            for item in steps:
                if item is WAIT:
                    break
                out[tag].append(item[0])
                if close_after.get(tag) == len(out[tag]):
                    steps.close()
                    del live[tag]
                    break
            else:
                del live[tag]
        if batch.rows:
            batch.step()
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_steps_leave_caches_as_generate_step_does(family):
    """A row closed part way through a cycle's tokens, and rows run to their
    end, hand back caches holding prompt + output[:-1] (difference 0)."""
    model = model_of(family)
    target = Target(model)
    batch = Batch(target)
    prompts = {"cut": prompt(60, 9), "end": prompt(61, 15), "stop": prompt(62, 4)}
    refs = {t: stock(model, p, 30) for t, p in prompts.items()}
    caches = {t: target.make_cache() for t in prompts}
    stop = refs["stop"][6]
    gens = {
        t: batch.steps(
            target,
            p,
            OracleDrafter(p + refs[t], vocab_size=VOCAB),  # every draft right
            cache=caches[t],
            max_tokens=30,
            block_size=8,
            stop_tokens=[stop] if t == "stop" else (),
        )
        for t, p in prompts.items()
    }
    # First token from the prefill, then 8 per cycle: 12 is mid-cycle.
    out = cooperate(batch, gens, close_after={"cut": 12})
    assert out["cut"] == refs["cut"][:12] and out["end"] == refs["end"]
    assert out["stop"] == refs["stop"][: refs["stop"].index(stop) + 1]
    assert not batch.rows
    for t, p in prompts.items():
        ref = autoregressive_cache(model, p, out[t][:-1])
        for a, b in zip(caches[t], ref):
            assert type(a) is type(b)
            if isinstance(b, KVCache):
                assert a.offset == b.offset == len(p) + len(out[t]) - 1, t
                xs = [x[..., : a.offset, :] for x in a.state[:2]]
                ys = [y[..., : b.offset, :] for y in b.state[:2]]
            else:
                xs, ys = a.cache, b.cache
            for x, y in zip(xs, ys):
                assert np.array_equal(np.array(x), np.array(y)), t


@pytest.mark.parametrize("alone", [True, False])
def test_a_row_cut_after_another_rows_prefill_rolls_back_exactly(alone):
    """A row closed part way through a cycle's tokens after another request's
    prefill chunks ran since that cycle (they overwrite the GatedDeltaNet
    taps' captures a rollback replays) still hands back caches holding
    prompt + output[:-1] (difference 0); alone in the batch, or with a row."""
    model = model_of("qwen3_5")
    target = Target(model)
    batch = Batch(target)
    pa, pb, pc = prompt(90, 9), prompt(91, 40), prompt(92, 7)

    def steps(p, n, cache, **options):
        ref = p + stock(model, p, n)
        d = OracleDrafter(ref, vocab_size=VOCAB)  # every draft right
        return batch.steps(target, p, d, cache=cache, max_tokens=n, block_size=8, **options)

    cache_a = target.make_cache()
    ga = steps(pa, 30, cache_a)
    out = [next(ga)[0]]
    assert next(ga) is WAIT
    if not alone:
        gc = steps(pc, 30, target.make_cache())
        next(gc)
        assert next(gc) is WAIT
    batch.step()  # A's outbox: 8 tokens
    gb = steps(pb, 10, target.make_cache(), prefill_step_size=16)
    assert next(gb) is WAIT and next(gb) is WAIT  # two of its chunks ran
    out += [next(ga)[0] for _ in range(3)]
    ga.close()  # 5 of the cycle's tokens untaken
    gb.close()
    ref = autoregressive_cache(model, pa, out[:-1])
    for a, b in zip(cache_a, ref):
        assert type(a) is type(b)
        if isinstance(b, KVCache):
            assert a.offset == b.offset == len(pa) + len(out) - 1
            xs = [x[..., : a.offset, :] for x in a.state[:2]]
            ys = [y[..., : b.offset, :] for y in b.state[:2]]
        else:
            xs, ys = a.cache, b.cache
        for x, y in zip(xs, ys):
            assert np.array_equal(np.array(x), np.array(y))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_joining_prefill_interleaves_with_running_rows(family):
    """A long prompt joins in chunks; the running row decodes a cycle between
    two of them, and both outputs stay exact. A join stopped between chunks
    raises `Cancelled` with the caches holding the chunks run."""
    from mlx_dflash.decode import Cancelled

    model = model_of(family)
    target = Target(model)
    batch = Batch(target)
    short, long = prompt(70, 6), prompt(71, 30)
    refs = {"short": stock(model, short, 40), "long": stock(model, long, 12)}
    order = []

    def gen(tag, p, n):
        drafter = OracleDrafter(p + refs[tag], vocab_size=VOCAB, schedule=[1, 3])
        steps = batch.steps(
            target, p, drafter, max_tokens=n, block_size=4, prefill_step_size=8
        )
        for item in steps:
            order.append((tag, item is WAIT))
            yield item

    gens = {"short": gen("short", short, 40)}
    first = next(gens["short"])[0]  # joined, alone in the batch
    gens["long"] = gen("long", long, 12)
    out = cooperate(batch, gens, close_after={})
    assert [first] + out["short"] == refs["short"]
    assert out["long"] == refs["long"]
    # The long prompt's 4 chunks: it waited 3 times before its first token,
    # and the short row got tokens in between.
    first_long = order.index(("long", False))
    waits = [i for i, e in enumerate(order[:first_long]) if e == ("long", True)]
    assert len(waits) == 3
    assert any(e == ("short", False) for e in order[waits[0] : first_long])

    cache, asked = target.make_cache(), []
    steps = batch.steps(
        target,
        long,
        OracleDrafter(long + refs["long"], vocab_size=VOCAB),
        cache=cache,
        prefill_step_size=8,
        should_stop=lambda: len(asked.append(0) or asked) > 2,
    )
    batch.join(short, PromptLookupDrafter(), max_tokens=50)  # someone to wait for
    with pytest.raises(Cancelled) as e:
        for _ in steps:
            pass
    assert e.value.filled == 16
    ref = make_prompt_cache(model)
    model(mx.array([long[:16]]), cache=ref)
    for a, b in zip(cache, ref):
        xs = a.state[:2] if isinstance(b, KVCache) else a.cache
        ys = b.state[:2] if isinstance(b, KVCache) else b.cache
        for x, y in zip(xs, ys):
            if isinstance(b, KVCache):
                x, y = x[..., : b.offset, :], y[..., : b.offset, :]
            assert np.allclose(np.array(x), np.array(y), atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_dflash_and_lookup_rows_match_solo_runs(family):
    """Each row's drafter gets its own rows' features: the drafts, hence the
    acceptance counts, are the solo run's too (a prompt-lookup-assisted row's as well)."""
    model = model_of(family)
    target = Target(model)
    shared = random_dflash(target).draft
    prompts = [prompt(10, 12), prompt(11, 30), prompt(12, 5) * 3, prompt(13, 4) * 4]
    # The last row's blocks take prompt lookup's continuations (lookup.py).
    assisted = lambda: DFlashDrafter(shared, target, lookup=LookupAssist(trust=1))  # noqa: E731
    drafters = [lambda: DFlashDrafter(shared, target)] * 2 + [PromptLookupDrafter, assisted]
    solo = []
    for p, make in zip(prompts, drafters):
        stats = SpecStats(8)
        steps = generate_step(
            target, p, make(), max_tokens=30, block_size=8, stats=stats
        )
        toks = [t for t, _ in steps]
        solo.append((toks, stats))
    stats = [SpecStats(8) for _ in prompts]
    joins = {
        0: [
            (i, p, make(), dict(max_tokens=30, block_size=8, stats=stats[i]))
            for i, (p, make) in enumerate(zip(prompts, drafters))
        ]
    }
    out, _ = drive(Batch(target), joins)
    for i, p in enumerate(prompts):
        assert out[i] == solo[i][0] == stock(model, p, 30), i
        assert stats[i].drafted_at == solo[i][1].drafted_at, i
        assert stats[i].accepted_at == solo[i][1].accepted_at, i


@pytest.mark.parametrize("sliding", [False, True])
def test_one_batched_draft_forward_gives_each_row_its_own_logits(sliding):
    """`prefetch`: rows of different context lengths (one past a 256-key
    bucket) and block sizes drafted in one forward get the logits of their
    own forward, with causal + windowed layers too."""
    target = Target(model_of("qwen3"))
    args = random_dflash(target).draft.args
    if sliding:
        args = dataclasses.replace(
            args, layer_types=["sliding_attention", "full_attention"], sliding_window=3
        )
    mx.random.seed(3)
    draft = DFlashDraft(args)
    draft.set_dtype(mx.float32)
    rows = []
    for i, (n_ctx, n) in enumerate([(12, 7), (300, 3), (5, 7), (9, 1)]):
        d = DFlashDrafter(draft, target)
        p = prompt(60 + i, n_ctx)
        prefill(target, target.make_cache(), d, p)
        rows.append((d, p[-1], n))
    solo = [np.array(d._logits(a, n)) for d, a, n in rows]
    prefetch(*zip(*rows))
    for (d, a, n), own in zip(rows, solo):
        assert d.ready is not None
        got = np.array(d._logits(a, n))
        assert got.shape == own.shape == (n, VOCAB)
        np.testing.assert_allclose(got, own, atol=1e-4)
        assert d.ready is None  # taken once


@pytest.mark.parametrize("lookup_row", [False, True])
def test_one_batched_context_pass_gives_each_row_its_own_caches(lookup_row):
    """`precommit`: rows' newly committed context (different lengths kept of
    one batched verify's captures, different context lengths before) in one
    draft pass leaves each drafter's caches as its own commit would; with a
    prompt-lookup row among them, the DFlash rows' captures are picked out."""
    target = Target(model_of("qwen3"))
    draft = random_dflash(target).draft
    width, kept = 8, [3, 8, 1]
    mine, own = [], []
    for i, n_ctx in enumerate((12, 40, 5)):
        for out in (mine, own):
            d = DFlashDrafter(draft, target)
            prefill(target, target.make_cache(), d, prompt(80 + i, n_ctx))
            out.append(d)
    F = len(draft.args.target_layer_ids) * target.hidden_size
    features = mx.random.normal((3, width, F))
    rows = [mine[0], PromptLookupDrafter(), mine[2]] if lookup_row else mine
    precommit(rows, kept, features)
    if lookup_row:
        assert mine[1].ready_kv is None  # not in the pass: its own commit runs
    for b, m in enumerate(kept):
        mine[b].commit([0] * m, features[b : b + 1, :m])
        own[b].commit([0] * m, features[b : b + 1, :m])
        assert mine[b].ready_kv is None  # taken once
        for x, y in zip(mine[b].cache, own[b].cache):
            assert x.offset == y.offset
            np.testing.assert_allclose(
                np.array(x.keys[..., : x.offset, :]),
                np.array(y.keys[..., : y.offset, :]),
                atol=1e-5,
            )
            np.testing.assert_allclose(
                np.array(x.values[..., : x.offset, :]),
                np.array(y.values[..., : y.offset, :]),
                atol=1e-5,
            )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05),
    ],
)
def test_sampled_rows_draw_as_their_solo_runs(params):
    """Each row keeps its own key, split as the one-row run splits it: for the
    same seed a batched row makes the same draws (one-hot drafts and drafts
    sampled from the drafter's own q)."""
    model = model_of("qwen3")
    target = Target(model)
    shared = random_dflash(target).draft
    rows = []
    for i in range(4):
        p = prompt(20 + i, 6 + 5 * i)
        if i % 2:
            ref = stock(model, p, 40)
            make = lambda p=p, ref=ref: OracleDrafter(
                p + ref, vocab_size=VOCAB, error_rate=0.3, seed=1
            )
        else:
            make = lambda: DFlashDrafter(shared, target)
        rows.append((p, make, SamplingParams(**{**params.__dict__, "seed": 100 + i})))
    opts = [dict(max_tokens=25, block_size=6, sampling=s) for _, _, s in rows]
    solo = [
        [t for t, _ in generate_step(target, p, make(), **o)]
        for (p, make, _), o in zip(rows, opts)
    ]
    joins = {0: [(i, p, make(), opts[i]) for i, (p, make, _) in enumerate(rows)]}
    out, _ = drive(Batch(target), joins)
    for i in range(4):
        assert out[i] == solo[i], i


@pytest.mark.slow
def test_concurrent_sampled_rows_are_distributed_as_the_target():
    """Chi-square of the first three tokens of rows decoded 8 at a time, each
    with its own seed, against the target's exact joint distribution."""
    model = small_vocab_model()
    target = Target(model)
    shared = small_drafter(target).draft
    params = SamplingParams(temperature=1.0)
    joint = exact_joint(model, params)
    greedy = stock(model, SMALL_PROMPT, 8)
    makers = {
        "dflash": lambda: DFlashDrafter(shared, target),
        "oracle": lambda: OracleDrafter(SMALL_PROMPT + greedy, vocab_size=SMALL_V),
    }
    samples = 3000
    for name, make in makers.items():
        counts = np.zeros(SMALL_V**3)
        for start in range(0, samples, 8):
            batch, rows = Batch(target), {}
            for s in range(start, start + 8):
                p = SamplingParams(temperature=1.0, seed=s)
                row, first = batch.join(
                    SMALL_PROMPT, make(), sampling=p, max_tokens=5, block_size=3, tag=s
                )
                rows[s] = [first[0]]
            while batch.rows:
                for row, toks in batch.step():
                    rows[row.tag] += [t for t, _ in toks]
                for row in list(batch.rows):
                    if len(rows[row.tag]) >= 3:
                        batch.leave(row)
            for toks in rows.values():
                a, b, c = toks[:3]
                counts[(a * SMALL_V + b) * SMALL_V + c] += 1
        assert chi2_pvalue(counts, joint) > 0.01, name


def test_plain_rows_ride_in_the_same_forward():
    """A row whose drafts all fail falls back to plain steps (blocks of the
    anchor alone) while another speculates; both stay exact."""
    model = model_of("qwen3_5")
    target = Target(model)
    p1, p2 = prompt(30, 10), prompt(31, 17)
    r1, r2 = stock(model, p1, 40), stock(model, p2, 40)
    fb = Fallback(window=1, plain_tokens=8, break_even=2.0)
    s1, s2 = SpecStats(16), SpecStats(16)
    wrong = OracleDrafter(p1 + r1, vocab_size=VOCAB, schedule=[0] * 99)
    right = OracleDrafter(p2 + r2, vocab_size=VOCAB, schedule=[9, 4])
    joins = {
        0: [
            (1, p1, wrong, dict(max_tokens=40, fallback=fb, stats=s1)),
            (2, p2, right, dict(max_tokens=40, stats=s2)),
        ]
    }
    out, _ = drive(Batch(target), joins)
    assert out[1] == r1 and out[2] == r2
    assert s1.plain_tokens > 0 and s2.plain_tokens == 0


def test_logprobs_per_row_equal_solo():
    model = model_of("llama")
    target = Target(model)
    p1, p2 = prompt(40, 9), prompt(41, 4)
    r1 = stock(model, p1, 20)
    opts = dict(max_tokens=20, block_size=8, logprobs=3)

    def oracle():
        return OracleDrafter(p1 + r1, vocab_size=VOCAB, schedule=[2, 0, 5])

    solo = list(generate_step(target, p1, oracle(), **opts))
    batch = Batch(target)
    r, first = batch.join(p1, oracle(), **opts)
    batch.join(p2, PromptLookupDrafter(), max_tokens=30, block_size=8)
    got = [first]
    while r in batch.rows:
        got += [o for row, toks in batch.step() if row is r for o in toks]
    assert [g[:2] for g in got] == [s[:2] for s in solo]
    for (_, _, (lp, top)), (_, _, (lp0, top0)) in zip(got, solo):
        assert abs(lp - lp0) <= 1e-6
        assert [i for i, _ in top] == [i for i, _ in top0]


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3_5"])
def test_block_kernels_take_batched_rows(family):
    """With the backend faked at its seam (test_linear.py), a batched verify
    of up to 64 rows in all takes the matmul launches as one block (whole
    layers where mirrored), flash.py's one-row attention declines it, and
    the batched rows still equal stock."""
    from test_linear import OpsKernels

    from mlx_dflash.kernels import BlockPath
    from mlx_dflash.kernels.attention import is_block

    ops = OpsKernels()
    target = Target(tiny_model(family), block_path=BlockPath.choose(ops))
    assert is_block(mx.zeros((1, 4, 8)), KVCache())
    assert is_block(mx.zeros((4, 16, 8)), KVCache())
    assert not is_block(mx.zeros((5, 16, 8)), KVCache())  # 80 rows
    model = target.model
    prompts = [prompt(50, 7), prompt(51, 19), prompt(52, 3)]
    refs = [stock(model, p, 30) for p in prompts]
    batch, out = Batch(target), {}
    for i, (p, ref) in enumerate(zip(prompts, refs)):
        drafter = OracleDrafter(p + ref, vocab_size=VOCAB, schedule=[i, 7, 2])
        row, first = batch.join(p, drafter, max_tokens=30, block_size=8, tag=i)
        out[i] = [first[0]]
    ops.calls = dict.fromkeys(ops.calls, 0)
    while batch.rows:
        for row, toks in batch.step():
            out[row.tag] += [t for t, _ in toks]
    assert [out[i] for i in range(3)] == refs
    assert ops.calls["flash"] == 0
    assert ops.calls["matmul"] + ops.calls["swiglu"] > 0
    if family == "llama":  # qwen2's q/k/v have biases, qwen3_5's layers are not mirrored
        for name in ("qkv", "residual", "norm"):
            assert ops.calls[name] > 0, name


def test_a_batch_of_one_decodes_over_its_own_caches():
    """A row alone takes the one-row path (flash.py's attention over its own
    `BucketKVCache`, backend faked at its seam); a second row moves it into
    the ragged caches, and back out when that row leaves; every token is
    stock's throughout."""
    from test_linear import OpsKernels

    from mlx_dflash.cache import BucketKVCache
    from mlx_dflash.kernels import BlockPath

    ops = OpsKernels()
    model = tiny_model("llama")
    target = Target(model, block_path=BlockPath.choose(ops))
    p1, p2 = prompt(70, 9), prompt(71, 14)
    r1, r2 = stock(model, p1, 40), stock(model, p2, 12)
    batch, out = Batch(target), {}

    def join(tag, p, ref, n):
        drafter = OracleDrafter(p + ref, vocab_size=VOCAB, schedule=[3, 7])
        cache = target.make_cache(bucket=True)
        row, first = batch.join(p, drafter, max_tokens=n, block_size=8, cache=cache, tag=tag)
        out[tag] = [first[0]]
        return row

    def step():
        for row, toks in batch.step():
            out[row.tag] += [t for t, _ in toks]

    row1 = join(1, p1, r1, 40)
    step()
    flash = ops.calls["flash"]
    assert flash > 0
    row2 = join(2, p2, r2, 12)
    assert row1.decoding.cache is None  # its caches are a row of the batch's
    step()
    assert ops.calls["flash"] == flash  # two rows: MLX's attention, ragged mask
    while row2 in batch.rows:
        step()
    assert isinstance(row1.decoding.cache[0], BucketKVCache)
    while batch.rows:
        step()
    assert ops.calls["flash"] > flash
    assert out[1] == r1 and out[2] == r2


def test_attention_layers_share_one_set_of_row_positions():
    """A batch's attention layers write their rows' new keys where each row's
    one-row cache would, from one offset array and one column index per
    forward (built once, not per layer: ragged.Positions)."""
    from mlx_dflash.ragged import RaggedCache

    rng = np.random.default_rng(0)
    solos = []
    for n in (5, 9):
        layers = []
        for _ in range(3):
            kv = KVCache()
            kv.update_and_fetch(*[mx.array(rng.normal(size=(1, 2, n, 4)), mx.float32)] * 2)
            layers.append(kv)
        solos.append(layers)
    batch = RaggedCache()
    for s in solos:
        batch.add(s)
    new = mx.array(rng.normal(size=(2, 2, 3, 4)), mx.float32)
    for c in batch.layers:
        c.update_and_fetch(new, new)
    first = batch.layers[0]
    for c in batch.layers[1:]:
        assert c.offset is first.offset
    assert first.positions.columns([5, 9], 3, new.shape) is first.positions.columns(
        [5, 9], 3, new.shape
    )
    for b, s in enumerate(solos):
        for c, kv in zip(batch.layers, s):
            keys, _ = kv.update_and_fetch(new[b : b + 1], new[b : b + 1])
            assert np.array_equal(np.array(c.row(b).keys), np.array(keys))
