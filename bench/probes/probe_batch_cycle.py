"""Probe: where a batched cycle (batch.py) spends its time, by phase and rows.

    python bench/probes/probe_batch_cycle.py qwen3-8b --rows 1,2,4
For each batch size C, C engine-mode rows (real-size random DFlash draft,
oracle tokens at tau 6.5) decode to --max-tokens; every phase of
`Batch.step` is made synchronous (its outputs evaluated, then
`mx.synchronize()`) and timed: the batched draft (`prefetch`), the rows'
proposals, the verify forward, the acceptance read, the rollback, the
batched context pass (`precommit`), the rows' records (drafter commits). One JSON line per C: median ms per cycle of each
phase and of the whole step. Synchronous phases lose the overlap the real
cycle has, so their sum exceeds an unprobed cycle: compare phases across C.
"""

import argparse
import json
import statistics
import time
from collections import defaultdict

import mlx.core as mx


def arrays(x):
    """The arrays inside an output (tuples, lists, dicts, dataclasses)."""
    if isinstance(x, mx.array):
        return [x]
    if isinstance(x, (tuple, list)):
        return [a for v in x for a in arrays(v)]
    if isinstance(x, dict):
        return [a for v in x.values() for a in arrays(v)]
    if hasattr(x, "__dataclass_fields__"):
        return arrays(vars(x))
    return []


def stashed(drafters, anchors, counts):
    """The logits `prefetch` left in the drafters."""
    ds = [getattr(d, "dflash", None) for d in drafters]
    return [d.ready[2] for d in ds if d is not None and d.ready is not None]


def committed(drafters, kept, features):
    """The context K/V `precommit` left in the drafters."""
    ds = [getattr(d, "dflash", None) for d in drafters]
    return [a for d in ds if d is not None and d.ready_kv for kv in d.ready_kv[1] for a in kv]


def timed(table, name, fn, extra=None):
    def run(*args, **kwargs):
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        mx.eval(arrays(out) + (extra(*args) if extra else []))
        mx.synchronize()
        table[name].append((time.perf_counter() - t0) * 1e3)
        return out

    return run


def engine_shape(shape: str, dtype):
    """A peaked random target of `shape`, its real-size random DFlash draft
    (the target capturing the draft's layers) and the vocabulary the engine
    drafter samples from: (model, target, draft, vocab)."""
    from mlx_dflash.bench.shapes import PRESETS, build_draft, build_target
    from mlx_dflash.target import Target

    model = build_target(shape, dtype=dtype, peaked=True)
    target = Target(model)
    draft = build_draft(shape, target.num_layers, dtype=dtype)
    target.set_capture_layers(draft.args.target_layer_ids)
    vocab = PRESETS[shape][2] or target.vocab_size
    return model, target, draft, vocab


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--rows", default="1,2,4")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args()
    from mlx_lm.generate import generate_step as stock_step

    from mlx_dflash import batch as batch_mod
    from mlx_dflash import decode
    from mlx_dflash.bench.engine import make_engine_drafter

    model, target, draft, vocab = engine_shape(a.shape, getattr(mx, a.dtype))
    table = defaultdict(list)
    forward = target.forward
    target.forward = timed(table, "verify forward", forward)
    batch_mod.prefetch = timed(table, "batched draft", batch_mod.prefetch, stashed)
    batch_mod.precommit = timed(table, "batched commit", batch_mod.precommit, committed)
    batch_mod.rollback_rows = timed(table, "rollback", batch_mod.rollback_rows)
    batch_mod.rollback = timed(table, "rollback", batch_mod.rollback)
    for name, method in (("propose", "propose"), ("record", "record"), ("read", "judge")):
        setattr(decode.Decoding, method, timed(table, name, getattr(decode.Decoding, method)))

    for c in [int(x) for x in a.rows.split(",")]:
        prompts = [[(31 * i + 7 * j) % 900 + 1 for j in range(64 + 16 * i)] for i in range(c)]
        refs = [
            p + [t for t, _ in stock_step(mx.array(p), model, max_tokens=a.max_tokens)]
            for p in prompts
        ]
        for rnd in range(2):  # round 0 warms up (compiles), round 1 is measured
            table.clear()
            target.forward = forward  # prefills untimed
            b = batch_mod.Batch(target)
            for p, ref in zip(prompts, refs):
                d = make_engine_drafter(
                    draft, target, ref, tau=6.5, block_size=16, vocab_size=vocab
                )
                b.join(p, d, max_tokens=a.max_tokens, block_size=16)
            target.forward = timed(table, "verify forward", forward)
            steps = []
            while len(b.rows) == c:  # full batches only
                t0 = time.perf_counter()
                b.step()
                steps.append((time.perf_counter() - t0) * 1e3)
            while b.rows:
                b.step()
        n = len(steps)
        row = {"shape": a.shape, "rows": c, "cycles": n,
               "step_ms": round(statistics.median(steps), 3)}
        for name, ts in table.items():
            # per cycle: the phase's calls of the full-batch cycles, summed per cycle
            per = len(ts) // max(1, n) if name in ("propose", "record", "read") else 1
            sums = [sum(ts[i * per:(i + 1) * per]) for i in range(min(n, len(ts) // per))]
            row[name + " ms"] = round(statistics.median(sums), 3) if sums else None
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
