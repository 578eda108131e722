"""Probe: where a batched cycle's host time goes, 1 row against C rows.

    python bench/probes/probe_batch_host.py qwen3-8b --rows 1,4

For each batch size, C engine-mode rows (real-size random DFlash draft,
oracle tokens at tau 6.5, greedy) decode together, unprobed, then once more
under cProfile. Per full-batch cycle it reports the wall ms (median,
unprofiled) and the profiled ms. Then, per Python function, the own time and
calls per cycle that grow most from the first batch size to the last: where
the host's extra work per row is. cProfile does not see MLX's own (nanobind)
calls: their time, graph building and the evaluations' encoding included,
counts in the Python function that made them (`seen` in target.py, which
starts the evaluation of a forward's first layers, holds most of it).
"""

import argparse
import cProfile
import json
import pstats
import time

import mlx.core as mx

from probe_batch_cycle import engine_shape  # bench/probes/, beside this script


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--rows", default="1,4")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--ways", default="together,per-row",
                   help="together: the rows' starts in one mx.async_eval (as shipped); "
                   "per-row: one per row (starts.together off)")
    p.add_argument("--stock-elements", type=int, default=None,
                   help="matmul.STOCK_ELEMENTS for this run (0: every dense product of "
                   "more than WIDE_ROWS rows takes stock's matmul, q/k/v and o included)")
    p.add_argument("--dump", default=None,
                   help="write every function's ms and calls per cycle, per batch size, "
                   "to this JSON file (to compare two versions of the code)")
    a = p.parse_args()
    if a.stock_elements is not None:
        from mlx_dflash.kernels import matmul

        matmul.STOCK_ELEMENTS = a.stock_elements
    from mlx_lm.generate import generate_step as stock_step

    from contextlib import nullcontext

    from mlx_dflash import batch as batch_mod
    from mlx_dflash.batch import Batch
    from mlx_dflash.bench.engine import make_engine_drafter

    model, target, draft, vocab = engine_shape(a.shape, getattr(mx, a.dtype))
    tables = {}
    shipped = batch_mod.together
    refs = {}  # rows -> (prompts, stock's greedy references), shared by the ways
    for way, c in [(w, int(x)) for x in a.rows.split(",") for w in a.ways.split(",")]:
        batch_mod.together = shipped if way == "together" else nullcontext
        if c not in refs:
            ps = [[(31 * i + 7 * j) % 900 + 1 for j in range(64 + 16 * i)] for i in range(c)]
            refs[c] = ps, [
                p + [t for t, _ in stock_step(mx.array(p), model, max_tokens=a.max_tokens)]
                for p in ps
            ]
        prompts, ref_rows = refs[c]

        def run(prof=None):
            b = Batch(target)
            for p, ref in zip(prompts, ref_rows):
                d = make_engine_drafter(draft, target, ref, tau=6.5, block_size=16, vocab_size=vocab)
                b.join(p, d, max_tokens=a.max_tokens, block_size=16)
            steps, outs = [], {id(r): [] for r in b.rows}
            if prof:
                prof.enable()
            while len(b.rows) == c:  # full batches only
                t0 = time.perf_counter()
                for r, o in b.step():
                    outs[id(r)] += [t for t, *_ in o]
                steps.append(time.perf_counter() - t0)
            if prof:
                prof.disable()
            while b.rows:
                b.step()
            return steps

        run()  # warm-up: compiles every kernel
        steps = run()
        prof = cProfile.Profile()
        psteps = run(prof)
        n = len(psteps)
        table = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)
        per = {}
        for (f, line, name), (cc, nc, tt, ct, _) in table.items():
            per[f"{name} ({f.rsplit('/', 1)[-1]}:{line})"] = (tt * 1e3 / n, nc / n)
        if way == a.ways.split(",")[0]:
            tables[c] = per
        steps.sort()
        print(json.dumps({
            "shape": a.shape, "way": way, "rows": c, "cycles": len(steps),
            "wall_ms_median": round(steps[len(steps) // 2] * 1e3, 3),
            "profiled_ms_per_cycle": round(sum(psteps) * 1e3 / n, 3),
        }), flush=True)
    if a.dump:
        with open(a.dump, "w") as f:
            json.dump({c: t for c, t in tables.items()}, f)
    cs = sorted(tables)
    lo, hi = tables[cs[0]], tables[cs[-1]]
    grow = sorted(set(lo) | set(hi), key=lambda k: -(hi.get(k, (0, 0))[0] - lo.get(k, (0, 0))[0]))
    for k in grow[: a.top]:
        print(json.dumps({
            "function": k,
            f"ms_{cs[0]}": round(lo.get(k, (0, 0))[0], 4), f"ms_{cs[-1]}": round(hi.get(k, (0, 0))[0], 4),
            f"calls_{cs[0]}": round(lo.get(k, (0, 0))[1], 1), f"calls_{cs[-1]}": round(hi.get(k, (0, 0))[1], 1),
        }), flush=True)


if __name__ == "__main__":
    main()
