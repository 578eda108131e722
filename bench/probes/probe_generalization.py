"""Probe: how far the default drafter's tau is from memorisation vs distribution.

    python bench/probes/probe_generalization.py [N] [TOKENS] [DRAFT]

Greedy tau (block 16, no fallback, the pair as `generate` loads it, float32 on
this CPU, OpenBLAS where present; every output checked against mlx_lm's own
greedy decoding) on three prompt sets of N each: the hand-written natural
held-out set (2 a category), the composed natural prompts of the training
generator with the recipe's seed (`natural_prompts(14000, seed=0)`: the
recipe generated responses to a random half of them), and prompts of the
same generator with another seed that the seed-0 set does not contain. One
JSON line per set.
"""

import json
import random
import sys
import time

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402

from mlx_dflash.load import DEFAULT_DRAFT, load_pair  # noqa: E402
from mlx_dflash.train.evaluate import natural_held_out, run_suite  # noqa: E402
from mlx_dflash.train.natural import natural_prompts  # noqa: E402


def key(p):
    return tuple((m["role"], m["content"]) for m in p.messages)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 18
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    draft = sys.argv[3] if len(sys.argv) > 3 else str(DEFAULT_DRAFT)
    pair = load_pair(None, draft, dtype=mx.float32)
    train = natural_prompts(14000, seed=0)
    seen = {key(p) for p in train}
    unseen = [p for p in natural_prompts(3000, seed=777) if key(p) not in seen]
    random.Random(1).shuffle(train)
    random.Random(1).shuffle(unseen)
    sets = [("held_out", natural_held_out(2)[:n]), ("train_seed0", train[:n]), ("unseen_seed777", unseen[:n])]
    for name, prompts in sets:
        t0 = time.time()
        r = run_suite(pair.target, pair.drafter, pair.tokenizer, prompts, max_tokens=tokens)
        print(json.dumps({
            "set": name, "tau": r["tau"], "prompts": r["prompts"], "max_tokens": tokens,
            "identical": r.get("identical_to_greedy"),
            "per_category": {k: v["tau"] for k, v in r.get("per_category", {}).items()},
            "seconds": round(time.time() - t0),
        }), flush=True)


if __name__ == "__main__":
    main()
