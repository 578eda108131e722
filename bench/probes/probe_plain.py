"""Probe: what a plain (fallback) decode step costs beyond stock mlx_lm's.

On the default pair at long context (the long_8k agent transcript), prints the
median ms per token over `--tokens` greedy tokens after the first, for:
  stock            mlx_lm.generate.generate_step (its own pipelined loop)
  loop             the same pipelined loop written here over `Target.forward`,
                   stock KVCache, no layer taps read
  loop+capture     ... plus the drafter's 5 layer taps concatenated each step
  loop+bucket      ... plus BucketKVCache (the cache DFlash uses on CUDA)
  dflash_plain     mlx-dflash's generate_step held in one plain stretch by the
                   fallback (one probe-block cycle first, excluded)
  dflash_plain+stream  the same on a stream of its own, as mlx_lm decodes
Variants run interleaved, `--reps` times, each after its own prefill.

    python bench/probes/probe_plain.py [--context 8192] [--tokens 256] [--reps 3] [--blas auto]
"""

import argparse
import json
import statistics
import sys
import time

from mlx_dflash.cli import pop_blas, use_blas

_blas, sys.argv[1:] = pop_blas(sys.argv[1:])
use_blas(_blas)  # OpenBLAS for MLX's CPU matmuls where present

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import generate_step as stock_step
from mlx_lm.models.cache import KVCache

from mlx_dflash.bench.suites import suite_prompts
from mlx_dflash.cache import BucketKVCache
from mlx_dflash.decode import generate_step
from mlx_dflash.fallback import Fallback
from mlx_dflash.load import load_target, make_drafter
from mlx_dflash.stats import SpecStats


def prefill(target, cache, prompt, step=2048):
    for s in range(0, len(prompt) - 1, step):
        target.forward(mx.array([prompt[s : min(s + step, len(prompt) - 1)]]), cache)
        mx.eval([c.state for c in cache])
    return mx.array(prompt[-1], mx.uint32)


def loop(target, prompt, n, *, capture, bucket):
    """mlx_lm's pipelined greedy loop over `Target.forward`: seconds per token."""
    layers = list(target.capture_layers)
    if not capture:
        target.set_capture_layers([])
    cache = [BucketKVCache() if bucket else KVCache() for _ in target.layers]
    y = prefill(target, cache, prompt)
    feats = []

    def step(x):
        logits, f = target.forward(x.reshape(1, 1), cache)
        t = mx.argmax(logits[0, -1]).astype(mx.uint32)
        mx.async_eval(t)
        feats.append(f)
        return t

    nxt = step(y)
    nxt.item()
    tic = time.perf_counter()
    for _ in range(n):
        cur, nxt = nxt, step(nxt)
        cur.item()
    nxt.item()
    target.set_capture_layers(layers)
    return (time.perf_counter() - tic) / (n + 1)


def stock(target, prompt, n):
    times = []
    for i, _ in enumerate(stock_step(mx.array(prompt), target.model, max_tokens=n + 1)):
        times.append(time.perf_counter())
    return (times[-1] - times[0]) / n


def dflash_plain(target, drafter, prompt, n):
    fb = Fallback(break_even=1e9, plain_tokens=n, max_plain=n)
    stats = SpecStats(16)
    for _ in generate_step(
        target, prompt, drafter, max_tokens=n + 2, fallback=fb, stats=stats
    ):
        pass
    return stats.plain_seconds / stats.plain_tokens


_STREAM = []


def on_new_stream(fn):
    if not _STREAM:
        _STREAM.append(mx.new_stream(mx.default_device()))
    with mx.stream(_STREAM[0]):
        return fn()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--model", default=None)
    a = p.parse_args()
    target, tok = load_target(a.model)
    drafter, _ = make_drafter(None, target)
    suite = "long_8k" if a.context <= 8192 else "long_16k"
    prompt = suite_prompts(suite, tok)[0][1][-a.context :]
    runs = {
        "stock": lambda: stock(target, prompt, a.tokens),
        "loop": lambda: loop(target, prompt, a.tokens, capture=False, bucket=False),
        "loop+capture": lambda: loop(
            target, prompt, a.tokens, capture=True, bucket=False
        ),
        "loop+bucket": lambda: loop(
            target, prompt, a.tokens, capture=True, bucket=True
        ),
        "dflash_plain": lambda: dflash_plain(target, drafter, prompt, a.tokens),
        # mlx_lm decodes on a stream of its own; we decode on the default one.
        "dflash_plain+stream": lambda: on_new_stream(
            lambda: dflash_plain(target, drafter, prompt, a.tokens)
        ),
    }
    for k, f in runs.items():  # warm-up: kernels compiled, buffers allocated
        print(f"warm-up {k}: {1e3 * f():.3f} ms/token", file=sys.stderr, flush=True)
    res = {k: [] for k in runs}
    for r in range(a.reps):
        for k, f in runs.items():
            res[k].append(1e3 * f())
            mx.clear_cache()
            print(
                f"rep {r} {k}: {res[k][-1]:.3f} ms/token", file=sys.stderr, flush=True
            )
    out = {
        "device": str(mx.default_device()),
        "context": len(prompt),
        "tokens": a.tokens,
        "ms_per_token": {k: round(statistics.median(v), 3) for k, v in res.items()},
        "all_ms": {k: [round(x, 3) for x in v] for k, v in res.items()},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
