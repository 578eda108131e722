"""Probe: what the sampled cycle adds over the greedy one, and its first-use cost.

Three modes, each printing JSON lines:
  ops SHAPE     the accept step alone on a (16, V) block of bf16 logits at the
                shape's vocabulary: median ms of each path (greedy; sampled
                one-hot and with a drafter's q, as shipped and as before #22)
                and of the ops inside them
  cold SHAPE    one path's first call in this process against its warm calls
                (run each path in a fresh process with MLX_PTX_CACHE_DIR empty:
                on CUDA the first call JIT-compiles what it needs)
  cycle SHAPE   a real-shape random target (bench's --peaked weights) and a
                5-layer DFlash draft: the first generations in the process
                (greedy, then sampled with the engine drafter, then sampled
                from the DFlash drafter's own q after `warm_up`), then one
                verify + accept cycle at a fixed context, greedy vs sampled

    python bench/probes/probe_sampling.py ops qwen3-8b
    MLX_PTX_CACHE_DIR=$(mktemp -d) python bench/probes/probe_sampling.py cold qwen3-8b --path legacy-onehot
    python bench/probes/probe_sampling.py cycle qwen3-8b --context 1024

"before #22" is `legacy_accept` below, kept here only to measure against.
"""

import argparse
import json
import time

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlx_dflash.bench.engine import make_engine_drafter
from mlx_dflash.bench.shapes import PRESETS, build_draft, build_target
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import DFlashDrafter
from mlx_dflash.rollback import rollback, snapshot
from mlx_dflash.sampling import (
    SamplingParams,
    log_weights,
    sample_draft,
    speculative_accept,
)
from mlx_dflash.target import Target
from mlx_dflash.warmup import warm_up

T1 = SamplingParams(temperature=1.0)
PATHS = [
    "greedy",
    "onehot",
    "q",
    "legacy-onehot",
    "legacy-q",
    "draft-q",
    "legacy-draft-q",
]


# ---- the accept step before #22 (for comparison only) ----------------------------


def legacy_probs(logits, params):
    x = logits.astype(mx.float32)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)
    if 0 < params.top_p < 1.0:
        x = apply_top_p(x, params.top_p)
    if params.min_p > 0:
        x = apply_min_p(x, params.min_p)
    if 0 < params.top_k < x.shape[-1]:
        x = apply_top_k(x, params.top_k)
    return mx.softmax(x / params.temperature, axis=-1)


def legacy_accept(draft, q, p, key):
    m = draft.shape[0]
    k_u, k_s = mx.random.split(key)
    if q is None:
        q = mx.zeros_like(p[:m])
        q = mx.put_along_axis(
            q, draft[:, None].astype(mx.int32), mx.array(1.0), axis=-1
        )
    idx = draft[:, None].astype(mx.int32)
    p_x = mx.take_along_axis(p[:m], idx, axis=-1)[:, 0]
    q_x = mx.take_along_axis(q, idx, axis=-1)[:, 0]
    u = mx.random.uniform(shape=(m,), key=k_u)
    accepted = u * q_x < p_x
    residual = mx.maximum(p[:m] - q, 0.0)
    residual = mx.where(residual.sum(-1, keepdims=True) > 0, residual, p[:m])
    rows = mx.concatenate([residual, p[m:]], axis=0)
    return accepted, mx.random.categorical(mx.log(rows), key=k_s)


# ---- the paths, on evaluated inputs -------------------------------------------------


def inputs(vocab: int, block: int, seed: int = 0):
    k1, k2, k3 = mx.random.split(mx.random.key(seed), 3)
    logits = (mx.random.normal((block, vocab), key=k1) * 4).astype(mx.bfloat16)
    draft_logits = (mx.random.normal((block - 1, vocab), key=k2) * 4).astype(
        mx.bfloat16
    )
    draft = mx.argmax(logits[:-1], axis=-1).astype(mx.uint32)
    mx.eval(logits, draft_logits, draft)
    return logits, draft_logits, draft, k3


def paths(logits, draft_logits, draft, key, params=T1):
    """name -> a function building that path's lazy outputs from the inputs."""
    q_new = log_weights(draft_logits, params)
    q_old = legacy_probs(draft_logits, params)
    mx.eval(q_new, q_old)  # the drafter's part is timed apart (draft-*)

    def greedy():
        c = mx.argmax(logits, axis=-1)
        return [draft == c[:-1], c]

    return {
        "greedy": greedy,
        "onehot": lambda: speculative_accept(
            draft, None, log_weights(logits, params), key
        ),
        "q": lambda: speculative_accept(draft, q_new, log_weights(logits, params), key),
        "legacy-onehot": lambda: legacy_accept(
            draft, None, legacy_probs(logits, params), key
        ),
        "legacy-q": lambda: legacy_accept(
            draft, q_old, legacy_probs(logits, params), key
        ),
        "draft-q": lambda: sample_draft(draft_logits, params, key),
        "legacy-draft-q": lambda: (
            lambda q: [mx.random.categorical(mx.log(q), key=key), q]
        )(legacy_probs(draft_logits, params)),
    }


def ops(logits, draft, key):
    """The ops the paths are made of, one at a time on (16, V)."""
    x = logits.astype(mx.float32)
    p = mx.softmax(x, axis=-1)
    idx = draft[:, None].astype(mx.int32)
    col = mx.arange(logits.shape[-1], dtype=mx.uint32)
    mx.eval(x, p)
    a = mx.array(3)
    return {
        "astype_f32": lambda: logits.astype(mx.float32),
        "scale": lambda: x * 0.7,
        "logsumexp": lambda: mx.logsumexp(x, axis=-1),
        "softmax": lambda: mx.softmax(x, axis=-1),
        "log": lambda: mx.log(p),
        "argmax": lambda: mx.argmax(x, axis=-1),
        "uniform_block": lambda: mx.random.uniform(shape=x.shape, key=key),
        "categorical_block": lambda: mx.random.categorical(x, key=key),
        "categorical_row": lambda: mx.random.categorical(x[0], key=key),
        "zeros_scatter": lambda: mx.put_along_axis(
            mx.zeros_like(p[:-1]), idx, mx.array(1.0), axis=-1
        ),
        "take_along_axis": lambda: mx.take_along_axis(x[:-1], idx, axis=-1),
        "take_row": lambda: mx.take(x, a, axis=0),
        "mask_where_sum": lambda: mx.where(col == draft[:, None], x[:-1], 0).sum(-1),
        "residual_block": lambda: mx.maximum(p[:-1] - p[1:], 0.0).sum(-1),
        "concatenate": lambda: mx.concatenate([p[:-1], p[-1:]], axis=0),
    }


def med_ms(f, reps: int, warm: int = 3) -> float:
    for _ in range(warm):
        mx.eval(f())
    ts = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(f())
        ts.append((time.perf_counter() - tic) * 1e3)
    return round(sorted(ts)[len(ts) // 2], 3)


def vocab_of(shape: str) -> int:
    config = PRESETS[shape][0]
    return config.get("text_config", config)["vocab_size"]


def run_ops(args):
    block = args.block
    logits, draft_logits, draft, key = inputs(vocab_of(args.shape), block)
    out = {"mode": "ops", "shape": args.shape, "block": block}
    out["paths_ms"] = {
        k: med_ms(f, args.reps)
        for k, f in paths(logits, draft_logits, draft, key).items()
    }
    out["ops_ms"] = {
        k: med_ms(f, args.reps) for k, f in ops(logits, draft, key).items()
    }
    print(json.dumps(out), flush=True)


def run_cold(args):
    logits, draft_logits, draft, key = inputs(vocab_of(args.shape), args.block)
    f = paths(logits, draft_logits, draft, key)[args.path]
    tic = time.perf_counter()
    mx.eval(f())
    first = (time.perf_counter() - tic) * 1e3
    out = {"mode": "cold", "shape": args.shape, "path": args.path}
    out.update(first_ms=round(first, 3), warm_ms=med_ms(f, args.reps, warm=0))
    print(json.dumps(out), flush=True)


# ---- a real-shape target -------------------------------------------------------------


def timed_generation(target, prompt, drafter, n, params, block):
    steps = generate_step(
        target, prompt, drafter, max_tokens=n, block_size=block, sampling=params
    )
    next(steps)  # the prefill and the first token
    tic = time.perf_counter()
    count = sum(1 for _ in steps)
    return round(count / (time.perf_counter() - tic), 2)


def run_cycle(args):
    block = args.block
    model = build_target(args.shape, peaked=True)
    target = Target(model)
    draft = build_draft(args.shape, target.num_layers, block_size=block)
    target.set_capture_layers(draft.args.target_layer_ids)
    vocab = target.vocab_size
    prompt = mx.random.randint(0, 1000, (args.context,), key=mx.random.key(1)).tolist()
    n = args.max_tokens
    # The engine's oracle replays the target's own greedy output.
    ref = [
        t
        for t, _ in generate_step(
            target, prompt, DFlashDrafter(draft, target), max_tokens=n
        )
    ]

    def engine():
        return make_engine_drafter(
            draft,
            target,
            prompt + ref,
            tau=args.tau,
            block_size=block,
            vocab_size=vocab,
        )

    out = {"mode": "cycle", "shape": args.shape, "context": args.context, "tokens": n}
    gens = out["generations_tps"] = {}
    gens["greedy_1"] = timed_generation(target, prompt, engine(), n, None, block)
    gens["greedy_2"] = timed_generation(target, prompt, engine(), n, None, block)
    for i in range(1, 4):
        p = SamplingParams(temperature=1.0, seed=i)
        gens[f"engine_T1_{i}"] = timed_generation(target, prompt, engine(), n, p, block)
    dflash = DFlashDrafter(draft, target)
    tic = time.perf_counter()
    warm_up(target, dflash, block, [T1], generate=False)
    out["warm_up_sampling_s"] = round(time.perf_counter() - tic, 3)
    for i in range(1, 3):
        p = SamplingParams(temperature=1.0, seed=i)
        gens[f"dflash_q_T1_{i}"] = timed_generation(target, prompt, dflash, n, p, block)
    print(json.dumps(out), flush=True)

    # One cycle at a fixed context: verify (flushed, as decode runs it) + accept, one eval.
    cache = target.make_cache()
    mx.eval(target.forward(mx.array([prompt]), cache, last_only=True)[0])
    tokens = mx.array([[ref[0]] + ref[1:block]], mx.uint32)
    draft_tokens = tokens[0, 1:]
    k = mx.random.key(0)
    _, q_new = dflash.propose_sampled(ref[0], block - 1, T1, k)
    q_old = legacy_probs(dflash._logits(ref[0], block - 1), T1)
    mx.eval(q_new, q_old)
    accepts = {
        "greedy": lambda lg: [mx.argmax(lg, axis=-1)],
        "onehot": lambda lg: speculative_accept(
            draft_tokens, None, log_weights(lg, T1), k
        ),
        "legacy-onehot": lambda lg: legacy_accept(
            draft_tokens, None, legacy_probs(lg, T1), k
        ),
        "q": lambda lg: speculative_accept(draft_tokens, q_new, log_weights(lg, T1), k),
        "legacy-q": lambda lg: legacy_accept(
            draft_tokens, q_old, legacy_probs(lg, T1), k
        ),
    }

    def cycle(accept):
        saved = snapshot(cache, target.delta_taps)
        logits, _ = target.forward(tokens, cache, flush=True)
        mx.eval(accept(logits[0]))
        rollback(cache, target.delta_taps, saved, verified=block, kept=7)
        mx.eval([c.state for c in cache])
        for c in cache:  # back to the same length: every rep measures the same
            if hasattr(c, "offset"):
                c.trim(7)

    for f in accepts.values():  # every path's first use before any is timed
        cycle(f)
    res = {"mode": "cycle_ms", "shape": args.shape, "context": args.context}
    res.update(
        {name: med_ms(lambda: cycle(f) or [], args.reps) for name, f in accepts.items()}
    )
    print(json.dumps(res), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["ops", "cold", "cycle"])
    p.add_argument("shape", choices=list(PRESETS))
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--path", default="onehot", choices=PATHS, help="cold: which path")
    p.add_argument("--context", type=int, default=1024, help="cycle: prompt length")
    p.add_argument("--max-tokens", type=int, default=128, help="cycle: per generation")
    p.add_argument("--tau", type=float, default=6.5, help="cycle: engine drafter τ")
    args = p.parse_args()
    {"ops": run_ops, "cold": run_cold, "cycle": run_cycle}[args.mode](args)


if __name__ == "__main__":
    main()
