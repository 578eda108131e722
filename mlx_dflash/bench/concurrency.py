"""`bench --concurrency 1,2,4`: C requests at once, decoded three ways.

For each concurrency C, C prompts (the cases' prompts in turn) all arrive at
t = 0 and are decoded, EOS off, to `max_tokens` each:
  - `mlx_lm batch`: stock mlx_lm's `BatchGenerator` (continuous batching, no
    drafter), the same C prompts;
  - `<arm> fifo`: our `generate_step`, one request after another (`serve`
    with `--max-batch 1`);
  - `<arm> batch`: our batched verify (batch.py, `serve --max-batch C`): the
    C prefills, then one verify forward per cycle for all rows.
Per way: aggregate tok/s (every stream's tokens over the time from arrival to
the last token), per-stream decode tok/s (a stream's tokens after its first,
over its first to last token) and TTFT (arrival to a stream's first token,
queueing included), medians over `repeats` rounds after one untimed warm-up
round. Greedy only; every stream is checked against stock greedy decoding.
"""

import json
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import BatchGenerator
from mlx_lm.generate import generate_step as mlx_generate_step

from ..batch import Batch
from ..decode import generate_step
from ..target import Target
from .runner import Arm, Case

STOCK = "mlx_lm batch"


class Clock:
    """Token arrival times per stream, from one start."""

    def __init__(self, streams: int):
        self.t0 = time.perf_counter()
        self.times: List[List[float]] = [[] for _ in range(streams)]
        self.tokens: List[List[int]] = [[] for _ in range(streams)]

    def add(self, i: int, token: int):
        self.tokens[i].append(int(token))
        self.times[i].append(time.perf_counter() - self.t0)

    def summary(self) -> dict:
        ends = [t[-1] for t in self.times]
        per_stream = [
            (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else 0.0
            for t in self.times
        ]
        return {
            "aggregate_tps": sum(map(len, self.times)) / max(ends),
            "per_stream_decode_tps": per_stream,
            "ttft_s": [t[0] for t in self.times],
        }


def run_stock(target: Target, prompts, max_tokens: int, prefill_step: int) -> Clock:
    gen = BatchGenerator(
        target.model,
        max_tokens=max_tokens,
        prefill_step_size=prefill_step,
        completion_batch_size=len(prompts),
        prefill_batch_size=len(prompts),
    )
    clock = Clock(len(prompts))
    uids = gen.insert([list(p) for p in prompts], [max_tokens] * len(prompts))
    index = {u: i for i, u in enumerate(uids)}
    while responses := gen.next_generated():
        for r in responses:
            clock.add(index[r.uid], r.token)
    gen.close()
    return clock


def run_fifo(target, prompts, drafters, arm: Arm, max_tokens, prefill_step) -> Clock:
    clock = Clock(len(prompts))
    for i, (p, d) in enumerate(zip(prompts, drafters)):
        steps = generate_step(
            target,
            p,
            d,
            max_tokens=max_tokens,
            block_size=arm.block_size,
            prefill_step_size=prefill_step,
            fallback=arm.fallback,
        )
        for t, _ in steps:
            clock.add(i, t)
    return clock


def run_batched(target, prompts, drafters, arm: Arm, max_tokens, prefill_step) -> Clock:
    clock = Clock(len(prompts))
    batch = Batch(target, prefill_step_size=prefill_step)
    for i, (p, d) in enumerate(zip(prompts, drafters)):
        row, first = batch.join(
            p,
            d,
            max_tokens=max_tokens,
            block_size=arm.block_size,
            fallback=arm.fallback,
            tag=i,
        )
        clock.add(i, first[0])
    while batch.rows:
        for row, outputs in batch.step():
            for t, *_ in outputs:
                clock.add(row.tag, t)
    return clock


def _median(runs: List[dict]) -> dict:
    """Per-stream medians over rounds, and the streams' median of those."""
    streams = len(runs[0]["ttft_s"])
    per = lambda key: [  # noqa: E731
        statistics.median(r[key][i] for r in runs) for i in range(streams)
    ]
    tps, ttft = per("per_stream_decode_tps"), per("ttft_s")
    return {
        "aggregate_tps": statistics.median(r["aggregate_tps"] for r in runs),
        "per_stream_decode_tps": tps,
        "per_stream_decode_tps_median": statistics.median(tps),
        "per_stream_decode_tps_min": min(tps),
        "ttft_s": ttft,
        "ttft_s_median": statistics.median(ttft),
        "ttft_s_max": max(ttft),
    }


def run_concurrency(
    target: Target,
    cases: Sequence[Case],
    arms: Sequence[Arm],
    levels: Sequence[int],
    *,
    repeats: int = 3,
    prefill_step: int = 2048,
    cooldown: float = 0.0,
    on_run: Optional[Callable[[str], None]] = None,
) -> List[dict]:
    """One result per (concurrency, arm): the three ways side by side."""
    note = on_run or (lambda _: None)
    if not all(c.sampling.greedy for c in cases):
        raise ValueError("--concurrency runs greedy requests only (leave out --temp)")
    if any(a.run is not None for a in arms):
        raise ValueError("--concurrency: z-lab's loop has no batched form")
    n = cases[0].max_tokens
    out = []
    for c in levels:
        prompts = [cases[i % len(cases)].prompt for i in range(c)]
        stock = [
            [t for t, _ in mlx_generate_step(mx.array(p), target.model, max_tokens=n)]
            for p in prompts
        ]
        for arm in arms:
            # The oracle-based drafters replay the stream's own output.
            refs = [list(p) + s for p, s in zip(prompts, stock)]
            ways: Dict[str, Callable[[], Clock]] = {
                STOCK: lambda: run_stock(target, prompts, n, prefill_step),
                f"{arm.name} fifo": lambda: run_fifo(
                    target, prompts, [arm.start(r) for r in refs], arm, n, prefill_step
                ),
                f"{arm.name} batch": lambda: run_batched(
                    target, prompts, [arm.start(r) for r in refs], arm, n, prefill_step
                ),
            }
            runs: Dict[str, List[dict]] = {w: [] for w in ways}
            exact: Dict[str, bool] = {w: True for w in ways}
            for r in range(repeats + 1):  # round 0 warms up, untimed
                for way, go in ways.items():
                    clock = go()
                    exact[way] &= clock.tokens == stock
                    if r:
                        runs[way].append(clock.summary())
                        time.sleep(cooldown)
                    note(f"C={c} {way} round {r}")
            out.append(
                {
                    "concurrency": c,
                    "arm": arm.name,
                    "max_tokens": n,
                    "prompt_tokens": [len(p) for p in prompts],
                    "ways": {
                        w: dict(_median(runs[w]), exact=exact[w], rounds=repeats)
                        for w in ways
                    },
                }
            )
    return out


def table(results: List[dict]) -> str:
    """Markdown: one row per (concurrency, way). Where C = 1 ran, each way's
    aggregate and slowest stream are also given against that way's one
    stream (the issue's "≥ 3× aggregate, each stream ≥ 0.8× alone")."""
    alone = {
        (r["arm"], way): w
        for r in results
        if r["concurrency"] == 1
        for way, w in r["ways"].items()
    }

    def against(x, one):
        return f"{x / one:.2f}×" if one else "—"

    lines = [
        "| C | way | aggregate tok/s | per-stream decode tok/s (median / min) "
        "| TTFT s (median / max) | aggregate / one stream | slowest stream / one stream "
        "| exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for way, w in res["ways"].items():
            one = alone.get((res["arm"], way), {})
            lines.append(
                f"| {res['concurrency']} | {way} | {w['aggregate_tps']:.1f} "
                f"| {w['per_stream_decode_tps_median']:.1f} / "
                f"{w['per_stream_decode_tps_min']:.1f} "
                f"| {w['ttft_s_median']:.3f} / {w['ttft_s_max']:.3f} "
                f"| {against(w['aggregate_tps'], one.get('aggregate_tps'))} "
                f"| {against(w['per_stream_decode_tps_min'], one.get('per_stream_decode_tps_median'))} "
                f"| {'yes' if w['exact'] else 'NO'} |"
            )
    return "\n".join(lines)


def run_from_args(args, target, label, arms, cases, *, on_run=None) -> dict:
    """`bench --concurrency` from the parsed flags: the suites' distinct
    prompts at the first `--max-tokens`; the JSON's top level."""
    from .report import environment

    if args.world.size > 1:
        raise ValueError("--concurrency is not supported under mlx.launch")
    if any(c < 1 for c in args.concurrency):
        raise ValueError(f"--concurrency: counts must be >= 1, got {args.concurrency}")
    n = args.max_tokens[0]
    seen, prompts = set(), []
    for c in cases:
        if c.max_tokens == n and tuple(c.prompt) not in seen:
            seen.add(tuple(c.prompt))
            prompts.append(c)
    results = run_concurrency(
        target,
        prompts,
        arms,
        args.concurrency,
        repeats=args.repeats,
        prefill_step=args.prefill_step_size,
        cooldown=args.cooldown,
        on_run=on_run,
    )
    settings = {k: v for k, v in vars(args).items() if k != "world"}
    settings.update(
        target=label, arms=[a.name for a in arms], eos="off (fixed lengths)"
    )
    return {
        "title": args.title or f"mlx-dflash bench --concurrency: {label}",
        "settings": settings,
        "environment": environment(),
        "concurrency": results,
    }


def write(results: dict, stem, command: str) -> list:
    """STEM.json (everything, with the command) and STEM.md (the table)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(dict(results, command=command), indent=1))
    paths[1].write_text(
        f"# {results['title']}\n\nCommand:\n\n```\n{command}\n```\n\n"
        f"{table(results['concurrency'])}\n"
    )
    return paths
