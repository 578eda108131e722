"""Probe: where one draft pass's time goes, bf16 against quantized drafts (issue #25).

    python bench/probes/probe_draft_pass.py qwen3-8b [--quantize 4] [--draft-bits 0,4]

The engine-mode bench reports the draft pass of a 4-bit draft slower than
bf16's on the H200 (bench/results/h200-q4-*-drafts-*.md: 2.9 vs 2.4 ms on the
Qwen3-8B shape), though Nsight Compute counted less GPU time for it (1.36 vs
1.49 ms, h200-ncu-batch-cycle-qwen3-8b.txt). Here the shape's target (4-bit
with --quantize 4, as those runs) and its real-size random 5-layer draft, bf16
and quantized as `--draft-quantize` does (load.quantize_draft), draft one
16-token block after 512 committed context tokens, in alternating rounds:
per pass the host time to build the graph (`build_ms`: DFlashDrafter._logits
returning), the wait for its evaluation after that (`eval_ms`), and the two
together (`pass_ms`); medians over --reps passes; and the commit of
--commit-rows accepted tokens' features after it (`commit_ms`: the context
K/V through the draft's k/v projections, evaluated, then trimmed off again),
which the bench's draft time leaves out; and both as a decode runs them
after reading a verify (`commit_pass_ms`: the commit started, the pass built
on it, one wait). With --flush 0,1, each draft with its pass's layers started
while the rest is built (`flush_every`) and without, in turn. One JSON line
per draft and flush (with --split, a flushed build's time in its layers'
`start_eval`s apart: `encode_ms`, and the rest `python_ms`); with
--profile N, each draft's host time over N graph builds by function.
Then the block's embedding alone (evaluated each time) with int32 and uint32
token ids: Nsight Compute timed the draft's int32-indexed gather at 192 us
against 4 us for the verify's uint32 one of the same size
(h200-ncu-batch-cycle-qwen3-8b-16x4.txt).
"""

import argparse
import json
import statistics
import time

import mlx.core as mx


def context_drafter(shape: str, target, bits: int, context: int):
    """The shape's real-size random DFlash draft on `target` (quantized to
    `bits` as `--draft-quantize` does; 0: bf16), `context` tokens of random
    target features committed and evaluated."""
    from mlx_dflash.bench.shapes import build_draft
    from mlx_dflash.drafters import DFlashDrafter
    from mlx_dflash.load import quantize_draft

    draft = build_draft(shape, target.num_layers)
    if bits:
        quantize_draft(draft, bits)
    mx.eval(draft.parameters())
    target.set_capture_layers(draft.args.target_layer_ids)
    d = DFlashDrafter(draft, target)
    features = mx.random.normal((1, context, draft.fc.weight.shape[-1]))
    d.commit(list(range(context)), features.astype(mx.bfloat16))
    mx.eval([c.state for c in d.cache])
    return d


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--quantize", type=int, default=4, help="target bits (0: bf16)")
    p.add_argument("--draft-bits", default="0,4")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--commit-rows", type=int, default=7)
    p.add_argument("--flush", default="0",
                   help="draft flush_every values to time in turn (0: off; CUDA's default is 1)")
    p.add_argument("--split", action="store_true",
                   help="report a flushed build's time inside its start_evals (encode_ms) apart")
    p.add_argument("--profile", type=int, default=0,
                   help="then cProfile this many graph builds of each draft (host time by function)")
    a = p.parse_args()
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.target import Target

    model = build_target(a.shape, peaked=True, quantize=a.quantize or None)
    target = Target(model)
    drafters = {
        bits: context_drafter(a.shape, target, bits, a.context)
        for bits in [int(b) for b in a.draft_bits.split(",")]
    }

    width = next(iter(drafters.values())).draft.fc.weight.shape[-1]
    rows = mx.random.normal((1, a.commit_rows, width)).astype(mx.bfloat16)

    # A flushed build's layers are encoded and launched inside the build
    # (draft.start_eval): with --split, the time in those calls is summed
    # apart from Python's own building.
    encoded = [0.0]
    if a.split:
        import mlx_dflash.draft as draft_module

        def timed_start(arrays, start=draft_module.start_eval):
            t = time.perf_counter()
            start(arrays)
            encoded[0] += time.perf_counter() - t

        draft_module.start_eval = timed_start

    def one(d):
        t0 = time.perf_counter()
        encoded[0] = 0.0
        logits = d._logits(5, 15)
        t1 = time.perf_counter()
        enc = encoded[0] * 1e3
        mx.eval(logits)
        t2 = time.perf_counter()
        d.commit(list(range(a.commit_rows)), rows)
        mx.eval([c.state for c in d.cache])
        t3 = time.perf_counter()
        d.trim(a.commit_rows)
        # As a decode runs them after reading a verify: the commit started,
        # the pass built on it, one wait for both.
        t4 = time.perf_counter()
        d.commit(list(range(a.commit_rows)), rows)
        mx.eval(d._logits(5, 15))
        t5 = time.perf_counter()
        d.trim(a.commit_rows)
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t5 - t4) * 1e3, enc

    for d in drafters.values():  # compiles every kernel
        for _ in range(5):
            one(d)
    flushes = [int(f) for f in a.flush.split(",")]
    times = {(b, f): [] for b in drafters for f in flushes}
    for _ in range(a.rounds):
        for bits, flush in times:
            d = drafters[bits]
            d.flush_every = flush
            times[bits, flush] += [one(d) for _ in range(a.reps)]
    for (bits, flush), ts in times.items():
        med = lambda xs: round(statistics.median(xs), 3)
        print(json.dumps(dict(
            shape=a.shape, target_bits=a.quantize or 16, draft_bits=bits or 16,
            flush_every=flush, context=a.context, passes=len(ts),
            build_ms=med([t[0] for t in ts]), eval_ms=med([t[1] for t in ts]),
            pass_ms=med([t[0] + t[1] for t in ts]), commit_rows=a.commit_rows,
            commit_ms=med([t[2] for t in ts]), commit_pass_ms=med([t[3] for t in ts]),
            **(dict(encode_ms=med([t[4] for t in ts]),
                    python_ms=med([t[0] - t[4] for t in ts])) if a.split else {}),
        )), flush=True)
    for bits, d in drafters.items() if a.profile else ():
        build_profile(d, bits, a.profile)
    print(json.dumps(dict(
        shape=a.shape, embed_ms={
            str(t): embed_ms(target, getattr(mx, t), a.reps) for t in ("int32", "uint32")
        },
    )), flush=True)


def build_profile(d, bits, n):
    """The host time of `n` graph builds of draft `d`'s pass (nothing
    evaluated), by function: the 4-bit draft's builds took 0.13 ms longer
    than bf16's on one H100 (h100-probe-draft-commit6-s40.jsonl)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        d._logits(5, 15)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    print(f"--- draft bits {bits or 16}: {n} builds", flush=True)
    print(out.getvalue().split("ncalls", 1)[-1], flush=True)


def embed_ms(target, dtype, reps):
    block = mx.array([[5] + [7] * 15], dtype=dtype)
    mx.eval(target.embed(block))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        mx.eval(target.embed(block))
        ts.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(ts), 3)


if __name__ == "__main__":
    main()
