"""Probe: how far the default drafter's tau is from memorisation vs distribution.

    python bench/probes/probe_generalization.py [N] [TOKENS] [DRAFT] [SEED] [COUNT] [SETS] [PIECES]

Greedy tau (block 16, no fallback, the drafter alone (no prompt lookup), the
pair as `generate` loads it otherwise, float32 on this CPU, OpenBLAS where
present; every output checked against mlx_lm's own greedy decoding) on prompt
sets of N each: `held_out`, the hand-written natural held-out set (N // 9 a
category); `train`, the composed natural prompts of the training generator with
a recipe's seed (`natural_prompts(COUNT, seed=SEED, pieces=PIECES)`, default
14000, 0 and 1, stage 3's: a recipe answers about half of them); `unseen`,
prompts of the same generator with another seed that neither that set nor seed
0's 14000 contain; `unseen2`, the same from version 2 of the generator's pieces
(`pieces=2`; stage 6 trained on `30000 ... 3 ... 2`); `unseen3` from version 3;
`free`, version 4's free-form requests (`natural_free.json`, written apart from
both the generator and the held-out set; stage 9 trained on a draw of version 4);
`free2`, version 5's second set (`natural_free_2.json`, written apart from all three).
SETS (comma-separated, default held_out,train,unseen) picks them. The composed
sets take N // 9 prompts a category (the held-out set's mix), N in all when N
is a multiple of 9. One JSON line per set.
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
from mlx_dflash.train.natural import FREE_FORM, FREE_FORM_2, _free, free_form, natural_prompts  # noqa: E402
from mlx_dflash.train.prompts import Prompt  # noqa: E402


def key(p):
    return tuple((m["role"], m["content"]) for m in p.messages)


def by_category(prompts, n):
    """The first n // 9 of each category (after a seeded shuffle), in turn."""
    prompts = list(prompts)
    random.Random(1).shuffle(prompts)
    cats = {}
    for p in prompts:
        cats.setdefault(p.kind, []).append(p)
    per = max(1, n // len(cats))
    return [p for c in sorted(cats) for p in cats[c][:per]]


def free_requests(n, files=(FREE_FORM.name,)):
    """n // 9 distinct free-form requests a category of `files`, framed as versions 4-5 frame them."""
    rng, out, pool = random.Random(777), [], free_form(files)
    for cat in sorted(pool):
        seen = set()
        while len(seen) < max(1, n // len(pool)):
            msgs = _free(rng, cat, files)
            if key(Prompt("", cat, msgs)) not in seen:
                seen.add(key(Prompt("", cat, msgs)))
                out.append(Prompt(msgs[-1]["content"], cat, msgs))
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 18
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    draft = sys.argv[3] if len(sys.argv) > 3 else str(DEFAULT_DRAFT)
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    count = int(sys.argv[5]) if len(sys.argv) > 5 else 14000
    wanted = (sys.argv[6] if len(sys.argv) > 6 else "held_out,train,unseen").split(",")
    pieces = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    pair = load_pair(None, draft, dtype=mx.float32, prompt_lookup="off")
    train = natural_prompts(count, seed=seed, pieces=pieces)
    seen = {key(p) for p in train} | {key(p) for p in natural_prompts(14000, seed=0)}

    def unseen(pieces):
        return [p for p in natural_prompts(3000, seed=777, pieces=pieces) if key(p) not in seen]

    make = {
        "held_out": lambda: ("held_out", natural_held_out(max(2, n // 9))[:n]),
        "train": lambda: (f"train_seed{seed}_pieces{pieces}", by_category(train, n)),
        "unseen": lambda: ("unseen_seed777", by_category(unseen(1), n)),
        "unseen2": lambda: ("unseen_seed777_pieces2", by_category(unseen(2), n)),
        "unseen3": lambda: ("unseen_seed777_pieces3", by_category(unseen(3), n)),
        "free": lambda: ("free_form_pieces4", free_requests(n)),
        "free2": lambda: ("free_form_2_pieces5", free_requests(n, (FREE_FORM_2.name,))),
    }
    for want in wanted:
        name, prompts = make[want]()
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
