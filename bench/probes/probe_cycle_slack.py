"""Probe: how much of a draft pass's device time a decode cycle waits on (issue #25).

    python bench/probes/probe_cycle_slack.py qwen3.6-27b [--quantize 4] [--draft-bits 0,4]
        [--delays 0,0.5,1,2,4] [--rounds 3] [--verify-flush auto,4@1]

On the 4-bit Qwen3.6-27B shape a 4-bit draft's pass measured 0.6 ms shorter
than bf16's alone (1.8 vs 2.4 ms), yet the cycle took 26.3 ms with either
(bench/results/h100-q4-qwen3_6-27b-drafts-s42-r9.md). If the host, not the
device, is what a cycle waits on while the draft runs, extra device work in
the draft costs nothing until it outgrows that slack. Here each draft pass
gets extra device time and no extra host time: one matmul of `rows` x W by
W x W (bf16) after the pass, which the drafted tokens depend on (so the
verify waits for it). `rows` is set per requested delay from the matmul's
own timed cost (`delay_ms`, the median of synced runs). The engine-mode
decode (oracle tokens at tau 6.5, greedy, output checked against stock)
then runs with each verify flush, draft and delay in alternating rounds; one
JSON line per run (`ms_per_cycle`: decode time after the first token over
cycles), then per flush and draft the median cycle at each delay and its
growth over the smallest delay, none by default (`extra_ms`). A growth near
0 while the delay is below the slack, then near the delay's own slope,
places the knee: how much device time a draft pass could spend
without the cycle noticing.
"""

import argparse
import json
import statistics
import time

import mlx.core as mx


class Delayed:
    """A drafter whose proposals also wait for `rows` x W @ W x W on the
    device (0 rows: none); everything else is the wrapped drafter's.
    `schedule` lists (rows, flush) taken in turn, one entry a proposal;
    `set_flush(flush)` is called with an entry's flush before its proposal
    (so the cycle's verify is built with it). `log` gets (entry,
    perf_counter) as each proposal starts."""

    def __init__(self, inner, a: mx.array, b: mx.array, schedule, set_flush):
        self.inner, self.a, self.b = inner, a, b
        self.schedule, self.set_flush = list(schedule), set_flush
        self.log = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, anchor, n):
        entry = self.schedule[len(self.log) % len(self.schedule)]
        rows, flush = entry
        self.set_flush(flush)
        self.log.append((entry, time.perf_counter()))
        drafted = self.inner.propose(anchor, n)
        if not rows or drafted.size == 0:
            return drafted
        z = (self.a[:rows] @ self.b)[0, 0]
        # Always 0 (|z| is far below 1e30), but the tokens now depend on z.
        return drafted + (z > 1e30).astype(drafted.dtype)


def paired(log, base):
    """Per schedule entry: each cycle's time (from its proposal to the next)
    less the time of the nearest earlier `base` cycle; slow drift of the host
    cancels between neighbours."""
    out, last = {}, None
    for (entry, t0), (_, t1) in zip(log, log[1:]):
        ms = (t1 - t0) * 1e3
        if entry == base:
            last = ms
        elif last is not None:
            out.setdefault(entry, []).append(ms - last)
    return out


def matmul_ms(a, b, rows: int, reps: int = 15) -> float:
    """Median wall ms of one synced `a[:rows] @ b`."""
    times = []
    for _ in range(reps + 3):
        t0 = time.perf_counter()
        mx.eval(a[:rows] @ b)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[3:])


def rows_for(a, b, delays, max_rows: int):
    """Rows whose matmul takes about each delay (ms): a first guess from the
    largest size's time per row, then one correction by the guess's own
    timing. Returns {delay: (rows, its timed ms)}."""
    per_row = matmul_ms(a, b, max_rows) / max_rows
    out = {}
    for d in delays:
        if d <= 0:
            out[d] = (0, 0.0)
            continue
        rows = max(1, min(max_rows, round(d / per_row)))
        rows = max(1, min(max_rows, round(rows * d / matmul_ms(a, b, rows))))
        out[d] = (rows, matmul_ms(a, b, rows))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3.6-27b")
    p.add_argument("--quantize", type=int, default=4, help="target bits (0: bf16)")
    p.add_argument("--draft-bits", default="0,4", help="0: bf16 draft")
    p.add_argument("--delays", default="0,0.5,1,2,4", help="extra device ms per draft pass")
    p.add_argument("--width", type=int, default=8192, help="W of the delay matmul")
    p.add_argument("--max-rows", type=int, default=16384)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--verify-flush", default="auto",
        help="comma list of E or E@F: a verify starts every E-th layer's output "
        "while the rest is built, the first after F layers (default F = E; auto: "
        "the backend's, every 4th on CUDA). Several alternate within each round, "
        "as the drafts and delays do: whether the verify's first launches reach "
        "the device later than a short draft finishes",
    )
    p.add_argument(
        "--per-cycle", action="store_true",
        help="the delays and verify flushes take turns cycle by cycle within each "
        "run, each cycle compared with the nearest earlier one with no delay and "
        "the first flush (host drift cancels); --delays must include 0",
    )
    a = p.parse_args()
    if a.per_cycle and 0 not in [float(x) for x in a.delays.split(",")]:
        p.error("--per-cycle compares with the no-delay cycle: --delays must include 0")
    from mlx_lm.generate import generate_step as stock_step

    from mlx_dflash.bench.engine import make_engine_drafter
    from mlx_dflash.bench.shapes import PRESETS, build_draft, build_target
    from mlx_dflash.decode import generate_step
    from mlx_dflash.kernels import BlockPath
    from mlx_dflash.load import quantize_draft
    from mlx_dflash.stats import SpecStats
    from mlx_dflash.target import Target

    path = BlockPath.choose()  # the Target's, chosen before a bad flag costs a build
    flushes = [_flush_spec(v, path.flush_every) for v in a.verify_flush.split(",")]
    dtype = getattr(mx, a.dtype)
    model = build_target(
        a.shape, dtype=dtype, peaked=True, quantize=a.quantize or None
    )
    target = Target(model, block_path=path)
    vocab = PRESETS[a.shape][2] or target.vocab_size
    drafts = {}
    for bits in [int(x) for x in a.draft_bits.split(",")]:
        d = build_draft(a.shape, target.num_layers, dtype=dtype)
        if bits:
            quantize_draft(d, bits)
        mx.eval(d.parameters())
        drafts[bits] = d
    target.set_capture_layers(next(iter(drafts.values())).args.target_layer_ids)
    prompt = [(7 * j) % 900 + 1 for j in range(128)]
    ref = [t for t, _ in stock_step(mx.array(prompt), model, max_tokens=a.max_tokens)]

    ka, kb = mx.random.split(mx.random.key(0))
    ma = mx.random.normal((a.max_rows, a.width), key=ka).astype(dtype)
    mb = mx.random.normal((a.width, a.width), key=kb).astype(dtype)
    mx.eval(ma, mb)
    delays = rows_for(ma, mb, [float(x) for x in a.delays.split(",")], a.max_rows)
    for d, (rows, ms) in delays.items():
        print(json.dumps({"delay_asked_ms": d, "rows": rows, "delay_ms": round(ms, 3)}))

    def run(bits, schedule):
        stats = SpecStats(block_size=16)
        drafter = Delayed(
            make_engine_drafter(
                drafts[bits], target, prompt + ref, tau=6.5, block_size=16,
                vocab_size=vocab,
            ),
            ma, mb, schedule, lambda f: target.set_verify_flush(*f),
        )
        out, t_first = [], None
        for t, _ in generate_step(
            target, prompt, drafter, max_tokens=a.max_tokens, block_size=16,
            stats=stats,
        ):
            out.append(t)
            t_first = t_first or time.perf_counter()  # cycles only, no prefill
        seconds = time.perf_counter() - t_first
        assert out == ref, f"draft {bits}-bit, rows {schedule}: output differs from stock"
        return seconds * 1e3 / max(1, stats.cycles), stats, drafter.log

    if a.per_cycle:
        return per_cycle(a, run, flushes, drafts, delays)
    arms = [(f, bits, d) for f in flushes for bits in drafts for d in delays]
    for f, bits, d in arms:  # warm-up: every kernel and key length once
        run(bits, [(delays[d][0], f)])
    cycles = {arm: [] for arm in arms}
    for r in range(a.rounds):
        for f, bits, d in arms if r % 2 == 0 else arms[::-1]:
            ms, stats, _ = run(bits, [(delays[d][0], f)])
            cycles[(f, bits, d)].append(ms)
            print(json.dumps({
                "shape": a.shape, "round": r, "draft_bits": bits or 16,
                "verify_flush": "%d@%d" % f,
                "delay_ms": round(delays[d][1], 3), "ms_per_cycle": round(ms, 3),
                "cycles": stats.cycles, "tau": round(stats.tau or 0.0, 3),
            }), flush=True)
    for f in flushes:
        for bits in drafts:
            base = statistics.median(cycles[(f, bits, min(delays))])
            for d in delays:
                med = statistics.median(cycles[(f, bits, d)])
                print(json.dumps({
                    "summary": a.shape, "verify_flush": "%d@%d" % f,
                    "draft_bits": bits or 16,
                    "delay_ms": round(delays[d][1], 3), "ms_per_cycle": round(med, 3),
                    "extra_ms": round(med - base, 3),
                }), flush=True)


def per_cycle(a, run, flushes, drafts, delays):
    """--per-cycle: every (delay, verify flush) takes its turn cycle by cycle
    within each run (the turns' start shifted each round); per run and then
    pooled over rounds, per entry the median of each cycle's time less the
    nearest earlier cycle with no delay and the first flush (`extra_ms`, from
    `paired`)."""
    entries = [(delays[d][0], f) for f in flushes for d in delays]
    base = (0, flushes[0])
    timed = {r: ms for r, ms in delays.values()}
    name = lambda e: "%g ms, flush %d@%d" % (round(timed[e[0]], 3), *e[1])
    for bits in drafts:  # warm-up
        run(bits, entries)
    pooled = {bits: {} for bits in drafts}
    for r in range(a.rounds):
        for bits in list(drafts) if r % 2 == 0 else list(drafts)[::-1]:
            turn = entries[r % len(entries):] + entries[: r % len(entries)]
            ms, stats, log = run(bits, turn)
            extra = paired(log, base)
            for k, v in extra.items():
                pooled[bits].setdefault(k, []).extend(v)
            print(json.dumps({
                "shape": a.shape, "round": r, "draft_bits": bits or 16,
                "ms_per_cycle": round(ms, 3), "cycles": stats.cycles,
                "tau": round(stats.tau or 0.0, 3),
                "extra_ms": {name(k): round(statistics.median(v), 3) for k, v in extra.items()},
            }), flush=True)
    for bits, extra in pooled.items():
        for k in entries:
            if k not in extra:
                continue
            v = extra[k]
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            print(json.dumps({
                "summary": a.shape, "per_cycle": True, "draft_bits": bits or 16,
                "delay_ms": round(timed[k[0]], 3), "verify_flush": "%d@%d" % k[1],
                "vs": name(base), "extra_ms": round(statistics.median(v), 3),
                "quartiles": [round(q[0], 3), round(q[2], 3)], "pairs": len(v),
            }), flush=True)


def _flush_spec(spec: str, default: int):
    """The bench's --verify-flush choice (auto, E or E@F) as (every, first),
    auto's E the backend's `default`: the values a run is labelled with."""
    from mlx_dflash.bench.arms import verify_flush_choice

    every, first = verify_flush_choice(spec)
    every = default if every is None else every
    return every, every if first is None else first


if __name__ == "__main__":
    main()
