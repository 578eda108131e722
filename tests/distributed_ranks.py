"""One rank of tests/test_distributed.py, run under `mlx.launch -n 2 --backend ring`.

Loads each MODEL_DIR through the product's sharded path (`load_pair(world=...)`),
then for each drafter decodes greedily and with a seeded temperature, and
checks that its own shard of the caches equals what autoregressive decoding
of the emitted tokens builds on that shard (stock mlx_lm forward on the same
sharded model). Writes OUT/{model dir name}.rank{r}.json; the test
compares them with the single-process runs.

    distributed_ranks.py [--pipeline] DRAFT_DIR OUT MODEL_DIR [MODEL_DIR ...]

With --pipeline the target is split into layer ranges (mlx_lm's `pipeline`)
instead of tensor parallel.
"""

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

from mlx_dflash.decode import generate_step
from mlx_dflash.distributed import World
from mlx_dflash.drafters import OracleDrafter, PromptLookupDrafter
from mlx_dflash.load import load_pair
from mlx_dflash.sampling import SamplingParams

PROMPT = [1, 5, 9, 3, 7, 2, 8, 4, 6, 10, 11, 12, 5, 9, 3]
N = 24
SAMPLING = SamplingParams(temperature=1.0, seed=7)
SCHEDULE = [0, 3, 7, 1, 14, 2, 9]  # the oracle rejects at these positions in turn


def autoregressive_cache(model, tokens):
    """Stock mlx_lm on this rank's shard: prompt in one pass, then one at a time."""
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    for t in tokens:
        model(mx.array([[t]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def cache_diff(ours, ref) -> float:
    """Max abs difference over every cache entry (inf on a shape mismatch)."""
    worst = 0.0
    for a, b in zip(ours, ref):
        if isinstance(a, KVCache):
            if a.offset != b.offset:
                return float("inf")
            pairs = [
                (x[..., : a.offset, :], y[..., : b.offset, :])
                for x, y in zip(a.state[:2], b.state[:2])
            ]
        else:
            pairs = list(zip(a.cache, b.cache))
        for x, y in pairs:
            if x.shape != y.shape:
                return float("inf")
            worst = max(worst, float(np.abs(np.array(x) - np.array(y)).max()))
    return worst


def run(world, model_dir: str, draft_dir: str, out: str):
    pair = load_pair(model_dir, draft_dir, world=world)
    target, model = pair.target, pair.target.model
    stock = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
    result = {"rank": world.rank, "world": world.info(), "stock": stock}
    # This rank's shard: its KV heads and GatedDeltaNet value heads.
    empty = autoregressive_cache(model, [])
    result["kv_heads"] = [c.keys.shape[1] for c in empty if isinstance(c, KVCache)]
    result["delta_heads"] = [
        c.cache[1].shape[1] for c in empty if isinstance(c, ArraysCache)
    ]
    drafters = {
        "dflash": pair.drafter,
        "lookup": PromptLookupDrafter(),
        "oracle": OracleDrafter(PROMPT + stock, vocab_size=96, schedule=SCHEDULE),
    }
    for name, drafter in drafters.items():
        for mode, sampling in (("greedy", None), ("sampled", SAMPLING)):
            if name == "oracle" and sampling is not None:
                continue
            cache = target.make_cache()
            steps = generate_step(
                target,
                PROMPT,
                drafter,
                cache=cache,
                max_tokens=N,
                block_size=8,
                sampling=sampling,
            )
            tokens = [t for t, _ in steps]
            diff = cache_diff(cache, autoregressive_cache(model, tokens[:-1]))
            result[f"{name}/{mode}"] = {"tokens": tokens, "cache_diff": diff}
    name = f"{Path(model_dir).name}.{world.mode}"
    Path(out, f"{name}.rank{world.rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    args = sys.argv[1:]
    pipeline = args[0] == "--pipeline"
    draft_dir, out, *model_dirs = args[1:] if pipeline else args
    world = World.init(pipeline=pipeline)
    for model_dir in model_dirs:
        run(world, model_dir, draft_dir, out)
