"""Probe: where a verify cycle's time goes — host graph building vs device work.

For a real-shape random target at a fixed context length, prints median ms of:
  ar_pipelined    stock mlx_lm per-token time with its async_eval pipelining
  ar_sync         one stock step, built and evaluated synchronously
  verify_build    building the lazy graph of a B-token `Target.forward` + argmax
  verify_eval     evaluating that already-built graph (device time + one sync)
  verify_sync     both, as the decode loop does them
  verify_flushed  the same forward with `Target.forward(flush=True)`: an
                  `mx.async_eval` every `--every` layers, so the device starts
                  while Python is still building
  rollback        rollback to 7 kept positions + eval of the cache state

    python bench/probes/probe_cycle.py qwen3-8b|qwen3.5-9b [--context 1024] [--every 4]
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlx_dflash.bench.shapes import PRESETS, build_target
from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.target import Target


def med(xs):
    xs = sorted(xs)
    return round(xs[len(xs) // 2], 3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=list(PRESETS))
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--block-linear", choices=["on", "off"], default="on", help="linear.py kernel"
    )
    p.add_argument(
        "--attention-kernel",
        choices=["on", "off"],
        default="on",
        help="flash.py's attention",
    )
    args = p.parse_args()
    model = build_target(args.shape)
    prompt = mx.random.randint(0, 1000, (args.context,))
    out = {"shape": args.shape, "context": args.context, "block": args.block}
    out["block_linear"] = args.block_linear
    out["attention_kernel"] = args.attention_kernel

    # Stock: mlx_lm's own loop (pipelined) and a synchronous single step.
    n = 64
    gen = generate_step(prompt, model, max_tokens=n + 8)
    for _ in range(8):
        next(gen)
    tic = time.perf_counter()
    for _ in range(n):
        next(gen)
    out["ar_pipelined"] = round((time.perf_counter() - tic) * 1e3 / n, 3)

    target = Target(
        model,
        flush_every=args.every,
        block_linear=args.block_linear == "on",
        attention_kernel=args.attention_kernel == "on",
    )
    cache = target.make_cache()
    mx.eval(target.forward(prompt[None], cache, last_only=True)[0])
    block = mx.random.randint(0, 1000, (1, args.block)).astype(mx.uint32)
    one = block[:, :1]

    def cycle(tokens, kept, t, flush=False):
        saved = snapshot(cache, target.delta_taps)
        tic = time.perf_counter()
        logits, _ = target.forward(tokens, cache, flush=flush)
        y = mx.argmax(logits, -1)
        t["build"].append(time.perf_counter() - tic)
        mx.eval(y)
        t["total"].append(time.perf_counter() - tic)
        tic = time.perf_counter()
        rollback(cache, target.delta_taps, saved, verified=tokens.shape[1], kept=kept)
        mx.eval([c.state for c in cache])
        t["rollback"].append(time.perf_counter() - tic)
        for c in cache:  # back to the same length: every rep measures the same
            if hasattr(c, "offset"):
                c.trim(kept)

    def run(tokens, kept, flush=False):
        t = {"build": [], "total": [], "rollback": []}
        for _ in range(3):
            cycle(tokens, kept, t, flush)
        t = {"build": [], "total": [], "rollback": []}
        for _ in range(args.reps):
            cycle(tokens, kept, t, flush)
        return {k: med([x * 1e3 for x in v]) for k, v in t.items()}

    r1 = run(one, 1)
    out["ar_sync"] = r1["total"]
    rb = run(block, 7)
    out["verify_build"] = rb["build"]
    out["verify_sync"] = rb["total"]
    out["verify_eval"] = round(rb["total"] - rb["build"], 3)
    out["rollback"] = rb["rollback"]

    out["verify_flushed"] = run(block, 7, flush=True)["total"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
