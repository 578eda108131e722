"""Probe: one decode step vs one 16-token verify of a real-shape random target.

Times, at a fixed context length, (a) stock mlx_lm: one token with a plain cache,
(b) our Target: a 16-token verify with its cache (bucketed KV, fused GatedDeltaNet
on CUDA) followed by a rollback that keeps 7 positions. Random bf16 weights.

    python bench/probes/probe_verify.py qwen3_8b|qwen3_5_9b [--context 1024]
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlx_dflash.bench.shapes import PRESETS, build_target
from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.target import Target

# The bench's shape presets (random bf16 weights, inference mode), under the
# names used in bench/results/speed.md, plus every preset by its own name.
SHAPES = {"qwen3_8b": "qwen3-8b", "qwen3_5_9b": "qwen3.5-9b", **{k: k for k in PRESETS}}


def timed(fn, reps):
    times = []
    for _ in range(reps):
        tic = time.perf_counter()
        fn()
        times.append((time.perf_counter() - tic) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", choices=list(SHAPES))
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args()
    model = build_target(SHAPES[args.shape])
    prompt = mx.random.randint(0, 1000, (1, args.context))

    # (a) stock: one decode step at this context length.
    cache = make_prompt_cache(model)
    mx.eval(model(prompt, cache=cache))

    def ar_step():
        mx.eval(model(mx.array([[5]]), cache=cache))
        for c in cache:
            if hasattr(c, "trim") and c.is_trimmable():
                c.trim(1)
            else:
                pass  # GatedDeltaNet state just advances; cost is what matters

    for _ in range(3):
        ar_step()
    ar_ms = timed(ar_step, args.reps)

    # (b) ours: 16-token verify + rollback to 7 kept positions, same context.
    target = Target(model)
    tcache = target.make_cache()
    mx.eval(target.forward(prompt, tcache, last_only=True)[0])
    block = mx.random.randint(0, 1000, (1, 16))

    def verify_cycle():
        saved = snapshot(tcache, target.delta_taps)
        logits, _ = target.forward(block, tcache)
        mx.eval(mx.argmax(logits, -1))
        rollback(tcache, target.delta_taps, saved, verified=16, kept=7)
        mx.eval([c.state for c in tcache])
        # Return to the same context length so every rep measures the same thing.
        for c in tcache:
            if hasattr(c, "offset"):
                c.trim(7)

    for _ in range(3):
        verify_cycle()
    verify_ms = timed(verify_cycle, args.reps)
    print(
        json.dumps(
            {
                "shape": args.shape,
                "context": args.context,
                "ar_step_ms": round(ar_ms, 3),
                "verify16_plus_rollback_ms": round(verify_ms, 3),
                "ratio": round(verify_ms / ar_ms, 3),
                "device": str(mx.default_device()),
            }
        )
    )


if __name__ == "__main__":
    main()
