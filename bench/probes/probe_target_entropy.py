"""Probe: are the target's answers to hand-written requests harder to draft in themselves?

    python bench/probes/probe_target_entropy.py [N] [TOKENS] [SETS]

The drafter scores ~3.1-3.4 on unseen prompts of the training generator and
~2.3-2.4 on the hand-written natural held-out set (train_natural.md). Either the
hand-written prompts are only far from what it was trained on (more, nearer
data would close the gap), or the target's answers to them are less predictable
in themselves (no data would). This measures the second without any drafter:
the target (the default GGUF, float32 on this CPU) answers each prompt greedily
(`greedy_batch`, TOKENS new tokens), then one teacher-forced forward over prompt
+ answer gives its next-token distribution at every answer position. Per set
and per category: the mean probability of the greedy token (`p1`), the mean
entropy in nats, the share of positions with p1 > 0.9 (`sure`), the mean length
of runs of such positions (`sure_run`), the share of answer tokens that
continue a 4-gram of the prompt (`copy`, what prompt lookup can draft) and the
mean answer length. Sets (comma-separated, default held_out,unseen3,train3):
`held_out`, the hand-written natural set (N // 9 a category, all 101 when N >=
101); `unseen3`, composed prompts of version 3 of the pieces with a seed no
recipe used (seed 777, not in stage 7's draw); `train3`, stage 7's own draw
(`natural_prompts(30000, seed=4, pieces=3)`). One JSON line per set.
"""

import json
import sys
import time

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_dflash.load import DEFAULT_DRAFT, load_pair  # noqa: E402
from mlx_dflash.train.data import greedy_batch  # noqa: E402
from mlx_dflash.train.evaluate import natural_held_out  # noqa: E402
from mlx_dflash.train.natural import natural_prompts  # noqa: E402
from mlx_dflash.train.prompts import encode_messages  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from probe_generalization import by_category, key  # noqa: E402


def answer_stats(model, prompt, answer):
    """Per answer position: (p1, entropy) of the target's distribution there."""
    seq = mx.array([list(prompt) + list(answer)])
    logits = model(seq)[0, len(prompt) - 1 : -1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    p = mx.exp(logp)
    picked = mx.take_along_axis(p, mx.array(answer)[:, None], axis=-1)[:, 0]
    ent = -(p * logp).sum(-1)
    mx.eval(picked, ent)
    return np.array(picked), np.array(ent)


def copied(prompt, answer, n=4):
    """Answer tokens whose preceding n-1 tokens and itself form an n-gram of the prompt."""
    grams = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
    full = list(prompt) + list(answer)
    start = len(prompt)
    return [tuple(full[i - n + 1 : i + 1]) in grams for i in range(start, len(full))]


def runs(mask):
    out, cur = [], 0
    for m in mask:
        if m:
            cur += 1
        elif cur:
            out.append(cur)
            cur = 0
    return out + ([cur] if cur else [])


def summarize(rows):
    p1 = np.concatenate([r["p1"] for r in rows])
    ent = np.concatenate([r["ent"] for r in rows])
    sure = p1 > 0.9
    run = [x for r in rows for x in runs(r["p1"] > 0.9)]
    return {
        "prompts": len(rows),
        "tokens": int(p1.size),
        "p1": round(float(p1.mean()), 3),
        "entropy": round(float(ent.mean()), 3),
        "sure": round(float(sure.mean()), 3),
        "sure_run": round(float(np.mean(run)) if run else 0.0, 2),
        "copy": round(float(np.mean([c for r in rows for c in r["copy"]])), 3),
        "answer_len": round(float(np.mean([len(r["p1"]) for r in rows])), 1),
    }


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 99
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    wanted = (sys.argv[3] if len(sys.argv) > 3 else "held_out,unseen3,train3").split(",")
    pair = load_pair(None, str(DEFAULT_DRAFT), dtype=mx.float32, prompt_lookup="off")
    tok, target = pair.tokenizer, pair.target
    train3 = natural_prompts(30000, seed=4, pieces=3)
    seen = {key(p) for p in train3}
    make = {
        "held_out": lambda: natural_held_out(None if n >= 101 else max(1, n // 9)),
        "unseen3": lambda: by_category(
            [p for p in natural_prompts(3000, seed=777, pieces=3) if key(p) not in seen], n
        ),
        "train3": lambda: by_category(train3, n),
    }
    stops = sorted(tok.eos_token_ids)
    for want in wanted:
        t0 = time.time()
        prompts = make[want]()
        ids = [encode_messages(tok, p.messages or [{"role": "user", "content": p.text}]) for p in prompts]
        answers = []
        for i in range(0, len(ids), 32):  # fixed-shape batches; each row = its own greedy run
            answers += greedy_batch(target, ids[i : i + 32], stop_tokens=stops, max_tokens=tokens)
        rows = []
        for p, x, a in zip(prompts, ids, answers):
            if not a:
                continue
            p1, ent = answer_stats(target.model, x, a)
            rows.append({"kind": p.kind, "p1": p1, "ent": ent, "copy": copied(x, a)})
        cats = sorted({r["kind"] for r in rows})
        print(json.dumps({
            "set": want, "max_tokens": tokens, **summarize(rows),
            "per_category": {c: summarize([r for r in rows if r["kind"] == c]) for c in cats},
            "seconds": round(time.time() - t0),
        }), flush=True)


if __name__ == "__main__":
    main()
