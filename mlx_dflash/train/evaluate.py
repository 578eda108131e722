"""`train --eval-only` suites: tau by category, by context length, greedy and sampled.

Suites (`--eval-sets`): `natural`, the hand-written held-out prompts
(`held_out_natural.json`, by category, never used in training); `long`, agent
transcripts of the eval share of stdlib files at each of `--eval-contexts`
prompt lengths (`agent_context`); `old`, the first `--eval-prompts` of the
shipped `held_out.json` (continuity with earlier figures). Every suite decodes
at block 16 without fallback. Greedy runs check each output against mlx_lm's
own greedy decoding; sampled runs (`--eval-temperatures`, one seed per prompt)
are lossless in distribution (tests/test_sampling.py), not token for token.
tau is pooled over cycles: (accepted + cycles) / cycles.
"""

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from typing import Dict, List, Optional, Sequence

from ..draft import DEFAULT_BLOCK_SIZE
from ..stats import SpecStats
from .prompts import Prompt, encode_messages, encode_prompt

HELD_OUT_NATURAL = Path(__file__).with_name("held_out_natural.json")


def add_eval_args(p):
    """The suites' flags (`--eval-only`)."""
    p.add_argument(
        "--eval-sets",
        default="old",
        help="--eval-only suites, comma-separated: natural (held_out_natural.json, "
        "by category), long (agent transcripts at --eval-contexts), old "
        "(held_out.json's first --eval-prompts)",
    )
    p.add_argument(
        "--eval-natural", type=int, default=None, help="natural prompts per category (default: all)"
    )
    p.add_argument(
        "--eval-contexts", default="1024,4096,7936", help="long: prompt lengths in tokens"
    )
    p.add_argument("--eval-context-prompts", type=int, default=3, help="long: transcripts per length")
    p.add_argument(
        "--eval-temperatures", default="", help="sampled runs too, e.g. 0.7,1.0 (seeded)"
    )
    p.add_argument(
        "--eval-sampled-natural", type=int, default=4, help="sampled: natural prompts per category"
    )
    p.add_argument(
        "--eval-sampled-context", type=int, default=1, help="sampled: transcripts per length"
    )
    p.add_argument("--eval-seed", type=int, default=0, help="transcripts and sampling seed")
    p.add_argument(
        "--eval-time-budget",
        type=float,
        default=None,
        help="seconds: suites not started by then are skipped (listed)",
    )
    p.add_argument("--eval-json", default=None, help="also write the result to this file")
    p.add_argument(
        "--draft-vocab",
        choices=["auto", "all"],
        default="auto",
        help="as generate's: auto drafts over the checkpoint's draft_vocab.json where "
        "it has one, all over the whole vocabulary",
    )
    p.add_argument(
        "--prompt-lookup",
        default="auto",
        metavar="auto|on|off|MIN[:TRUST]",
        help="as generate's (auto: on for the shipped drafter only)",
    )


def natural_held_out(per_category: Optional[int] = None) -> List[Prompt]:
    """The natural held-out prompts, the first `per_category` of each category."""
    out, seen = [], {}
    for h in json.loads(HELD_OUT_NATURAL.read_text()):
        seen[h["category"]] = seen.get(h["category"], 0) + 1
        if per_category is None or seen[h["category"]] <= per_category:
            out.append(Prompt(h["messages"][-1]["content"], h["category"], h["messages"]))
    return out


def natural_kinds(tokenizer, data) -> List[str]:
    """The category of each of `data`'s sequences (a `Dataset` of answers to
    natural held-out prompts), found by its prompt."""
    kind = {tuple(encode_prompt(tokenizer, p)): p.kind for p in natural_held_out()}
    return [kind[tuple(data.sequence(i)[: int(data.prompt_lens[i])].tolist())] for i in range(len(data))]


def long_context_prompts(tokenizer, lengths: Sequence[int], per_length: int, seed: int = 0):
    """{length: [Prompt]}: eval-share transcripts of about `length` tokens."""
    from .agent_context import transcript

    return {
        n: [
            Prompt("", f"ctx{n}", transcript(tokenizer, n, seed * 1_000_003 + n * 101 + i, split="eval"))
            for i in range(per_length)
        ]
        for n in lengths
    }


def as_drafter(draft, target):
    """A fresh `DFlashDrafter` of `draft`: a draft model (whole vocabulary),
    or a drafter, copied with its draft vocabulary and no context."""
    from ..drafters import DFlashDrafter

    return draft.fresh() if isinstance(draft, DFlashDrafter) else DFlashDrafter(draft, target)


def decode_tau(target, draft, prompt_ids, *, max_tokens, stop_tokens, temperature=0.0, seed=0):
    """(stats, identical) of one DFlash run of `draft` (a draft model or a
    `DFlashDrafter`: `as_drafter`); `identical` compares a greedy run's
    output with mlx_lm's greedy `generate_step` (None when sampled)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step as mlx_generate_step

    from ..decode import generate_step
    from ..sampling import SamplingParams

    s = SpecStats(DEFAULT_BLOCK_SIZE)
    sampling = SamplingParams(temperature=temperature, seed=seed) if temperature else None
    out = [
        t
        for t, _ in generate_step(
            target,
            list(prompt_ids),
            as_drafter(draft, target),
            max_tokens=max_tokens,
            block_size=DEFAULT_BLOCK_SIZE,
            stop_tokens=stop_tokens,
            sampling=sampling,
            stats=s,
        )
    ]
    if temperature:
        return s, None
    ref, stops = [], set(stop_tokens)
    for tok, _ in mlx_generate_step(mx.array(list(prompt_ids)), target.model, max_tokens=len(out)):
        ref.append(int(tok))
        if int(tok) in stops:
            break
    return s, ref == out


def _summary(stats: SpecStats, n: int, identical) -> dict:
    d = {"prompts": n, "cycles": stats.cycles, "tau": None if stats.tau is None else round(stats.tau, 3)}
    if identical is not None:
        d["identical_to_greedy"] = identical
    return d


def run_suite(target, draft, tokenizer, prompts: Sequence[Prompt], *, max_tokens, temperature=0.0, seed=0) -> dict:
    """Pooled tau over `prompts` and per category (`Prompt.kind`)."""
    target.set_capture_layers(as_drafter(draft, target).capture_layers)
    stops = sorted(tokenizer.eos_token_ids)
    total, cats, same = SpecStats(DEFAULT_BLOCK_SIZE), {}, True
    for i, p in enumerate(prompts):
        ids = encode_messages(tokenizer, p.messages or [{"role": "user", "content": p.text}])
        s, ok = decode_tau(target, draft, ids, max_tokens=max_tokens, stop_tokens=stops, temperature=temperature, seed=seed + i)
        total.merge(s)
        c = cats.setdefault(p.kind, [SpecStats(DEFAULT_BLOCK_SIZE), 0, True])
        c[0].merge(s)
        c[1] += 1
        if ok is not None:
            c[2] &= ok
            same &= ok
    ident = None if temperature else same
    out = _summary(total, len(prompts), ident)
    out["per_position_acceptance"] = total.as_dict()["per_position_acceptance"]
    if len(cats) > 1:
        out["per_category"] = {k: _summary(v[0], v[1], None if temperature else v[2]) for k, v in cats.items()}
    return out


def evaluate(target, draft, tokenizer, a, on_suite=None) -> dict:
    """The suites of `--eval-sets` in priority order, within `--eval-time-budget`
    (the first always runs; a later one not started in time is listed as
    skipped, never cut short). `on_suite(result so far)` after each suite: a
    process stopped from outside (a call's timeout) keeps the suites it finished."""
    t0 = time.perf_counter()
    temps = [float(t) for t in a.eval_temperatures.split(",") if t]
    ctx_max = getattr(target.lm.args, "max_position_embeddings", None)
    lengths = [int(n) for n in a.eval_contexts.split(",") if n]
    if ctx_max:
        too_long = [n for n in lengths if n + a.eval_max_tokens > ctx_max]
        if too_long and "long" in a.eval_sets:
            raise ValueError(
                f"--eval-contexts {too_long}: with --eval-max-tokens "
                f"{a.eval_max_tokens} past the target's context ({ctx_max} tokens)"
            )
    plan = []
    if "natural" in a.eval_sets:
        nat = natural_held_out(a.eval_natural)
        plan.append((("natural", "greedy"), nat, 0.0))
    if "long" in a.eval_sets:
        longs = long_context_prompts(tokenizer, lengths, a.eval_context_prompts, a.eval_seed)
        plan += [((f"long_{n}", "greedy"), ps, 0.0) for n, ps in longs.items()]
    for t in sorted(temps, reverse=True):  # agents sample at 1.0: that one first
        if "natural" in a.eval_sets:
            plan.append((("natural", f"T{t}"), natural_held_out(a.eval_sampled_natural), t))
        if "long" in a.eval_sets:
            plan += [((f"long_{n}", f"T{t}"), ps[: a.eval_sampled_context], t) for n, ps in longs.items()]
    if "old" in a.eval_sets:
        from .prompts import build_prompts

        _, held = build_prompts(seed=a.seed)
        plan.append((("old", "greedy"), held[: a.eval_prompts], 0.0))
    result: Dict[str, dict] = {"block_size": DEFAULT_BLOCK_SIZE, "max_tokens": a.eval_max_tokens, "skipped": []}
    ran = 0  # the first suite always runs
    for (suite, mode), prompts, temp in plan:
        if not prompts:
            continue
        el = time.perf_counter() - t0
        if a.eval_time_budget is not None and el > a.eval_time_budget and ran:
            result["skipped"].append(f"{suite}/{mode}")
            continue
        ts = time.perf_counter()
        r = run_suite(target, draft, tokenizer, prompts, max_tokens=a.eval_max_tokens, temperature=temp, seed=a.eval_seed)
        r["seconds"] = round(time.perf_counter() - ts, 1)
        result.setdefault(suite, {})[mode] = r
        ran += 1
        if on_suite:
            on_suite(result)
        print(f"eval {suite}/{mode}: tau {r['tau']} over {r['prompts']} prompts ({r['seconds']}s)", flush=True, file=sys.stderr)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def held_out_tau(target, tokenizer, draft, a) -> dict:
    """Held-out tau of `draft` at block 16, greedy, checked against mlx_lm."""
    from .data import build_prompts, encode
    from .trainer import evaluate_tau

    _, held_out = build_prompts(seed=a.seed)
    prompts = [encode(tokenizer, p.text) for p in held_out[: a.eval_prompts]]
    stats, taus, same = evaluate_tau(
        target,
        draft,
        prompts,
        max_tokens=a.eval_max_tokens,
        block_size=DEFAULT_BLOCK_SIZE,
        stop_tokens=sorted(tokenizer.eos_token_ids),
    )
    tau = "n/a" if stats.tau is None else f"{stats.tau:.2f}"
    print(
        f"held-out tau {tau} over {len(prompts)} prompts, "
        f"identical to greedy: {same}",
        file=sys.stderr,
    )
    return {
        "prompts": len(prompts),
        "max_tokens": a.eval_max_tokens,
        "tau": None if stats.tau is None else round(stats.tau, 3),
        "identical_to_greedy": same,
        "per_prompt_tau": [None if t is None else round(t, 2) for t in taus],
        "stats": stats.as_dict(),
    }


def eval_only(a):
    """The drafter in --out (default: the shipped one) as `generate` runs it."""
    from ..load import DEFAULT_DRAFT, load_pair
    from ..lookup import check_flag, lookup_of

    path = Path(a.out or DEFAULT_DRAFT)
    dtype = getattr(mx, a.dtype) if a.dtype else None
    try:
        check_flag(a.prompt_lookup)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    pair = load_pair(
        a.model, str(path), dtype=dtype, draft_vocab=a.draft_vocab, prompt_lookup=a.prompt_lookup
    )
    sets = set(a.eval_sets.split(","))
    if not sets <= {"natural", "long", "old"}:
        raise SystemExit(f"error: --eval-sets {a.eval_sets}: use natural, long, old")
    a.eval_sets = sets
    # Ids the drafter may propose (None: the whole vocabulary), as `generate --json`.
    vocab_size = None if pair.drafter.vocab is None else len(pair.drafter.vocab)
    result = {"draft": str(path), "draft_vocab": vocab_size, "prompt_lookup": lookup_of(pair.drafter)}

    def save(partial=None):  # also after each suite: a cut process keeps what it finished
        if a.eval_json:
            Path(a.eval_json).write_text(json.dumps({**result, **(partial or {})}, indent=1))

    if sets == {"old"}:  # the recorded figures' format
        result.update(held_out_tau(pair.target, pair.tokenizer, pair.drafter, a))
    else:
        from .evaluate import evaluate

        try:
            ev = evaluate(pair.target, pair.drafter, pair.tokenizer, a, on_suite=save)
        except ValueError as e:
            raise SystemExit(f"error: {e}")
        result.update(ev)
    print(json.dumps(result))
    save()
    return result
