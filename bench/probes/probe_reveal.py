"""Probe: would a second draft pass, with the first pass's confident tokens
filled into the block, accept more? (issue #23)

    python bench/probes/probe_reveal.py DRAFT MAX_TOKENS [THRESHOLDS] [N]

A DFlash drafter predicts a block's positions in parallel from `[anchor, MASK
x 15]`: position k does not see what it predicted at 1 .. k-1, and its
acceptance falls with k. A second pass whose block holds the first pass's
tokens at 1 .. r (the leading run predicted with probability >= a threshold)
and masks after r conditions positions > r on them. The drafter was trained
on masked blocks only, so this measures it zero-shot: if a filled block
already helps, training on partly filled blocks (block diffusion's re-masking)
is worth a GPU run.

The natural held-out set (or its first N), answered greedily by the default target (float32,
this CPU, <= MAX_TOKENS new tokens). At every response position, one block
as `trainer.estimate_tau` scores it, then greedy decoding's tau walked from
the runs (p -> p + run + 1):
  - one pass (what ships);
  - oracle: positions 1 .. run1 (pass 1's correct run) filled with the true
    tokens, pass 2 extends from run1 + 1 (an upper bound for any threshold);
  - threshold T: pass 1's leading tokens of probability >= T filled (right
    or wrong), pass 2's tokens after them.
One JSON line for all.
"""

import json
import sys
import time

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_dflash.draft import load_draft  # noqa: E402
from mlx_dflash.train.cli import load_target  # noqa: E402
from mlx_dflash.train.data import generate_responses  # noqa: E402
from mlx_dflash.train.evaluate import natural_held_out  # noqa: E402
from mlx_dflash.train.objective import draft_blocks_forward, make_blocks  # noqa: E402
from mlx_dflash.train.prompts import encode_prompt  # noqa: E402
from mlx_dflash.train.trainer import (  # noqa: E402
    TrainArgs,
    dense_head,
    every_position_batches,
    walk_cycles,
)


def predict(draft, target, head, ids, feats, anchors):
    """(tokens, probabilities) of the drafter's top-1 at block positions 1 .. B-1."""
    h = draft_blocks_forward(draft, target.embed(ids), feats, anchors)[:, :, 1:]
    N, A, K, H = h.shape
    toks, probs = [], []
    flat = h.reshape(-1, H)
    for s in range(0, flat.shape[0], 2048):  # the head over a few rows at a time
        logits = head(flat[s : s + 2048]).astype(mx.float32)
        toks.append(mx.argmax(logits, axis=-1))
        probs.append(mx.softmax(logits, axis=-1).max(axis=-1))
        mx.eval(toks[-1], probs[-1])
    shape = (N, A, K)
    return (np.array(mx.concatenate(toks)).reshape(shape),
            np.array(mx.concatenate(probs)).reshape(shape))


def leading(ok):
    """Length of the leading run of True along the last axis."""
    return np.cumprod(ok, axis=-1).sum(-1)


def main():
    draft_path, max_tokens = sys.argv[1], int(sys.argv[2])
    thresholds = [float(t) for t in sys.argv[3].split(",")] if len(sys.argv) > 3 else [0.5, 0.8]
    target, tok = load_target(None, "float32")
    draft = load_draft(draft_path, target=target, dtype=mx.float32)
    target.set_capture_layers(draft.args.target_layer_ids)
    head = dense_head(target, mx.float32)
    B, mask_id = draft.args.block_size, draft.args.mask_token_id
    prompts = natural_held_out()[: int(sys.argv[4]) if len(sys.argv) > 4 else None]
    t0 = time.perf_counter()
    data = generate_responses(
        target, [encode_prompt(tok, p) for p in prompts], stop_tokens=sorted(tok.eos_token_ids),
        max_tokens=max_tokens, batch_size=len(prompts), min_response=1,
    )
    print(f"answers: {len(data)}, {data.response_tokens()} tokens, "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    args = TrainArgs(batch_size=2, batch_tokens=1024, max_len=8192)
    arms = ["one_pass", "oracle"] + [f"threshold_{t}" for t in thresholds]
    totals = {a: [0, 0] for a in arms}  # tokens, cycles
    done = 0
    for idx, (tokens, lengths, anchors, real, _), feats in every_position_batches(target, data, args):
        ids, labels, lpos = make_blocks(tokens, anchors, B, mask_id)
        valid = np.array((lpos < lengths[:, None, None]) & real[:, :, None])
        labels_np, ids_np = np.array(labels), np.array(ids)
        pred1, prob1 = predict(draft, target, head, ids, feats, anchors)
        run1 = leading((pred1 == labels_np) & valid)
        k = np.arange(1, B)[None, None, :]  # block position of each label
        runs = {"one_pass": run1}
        # Oracle: the true tokens at 1 .. run1, pass 2 after them.
        filled = ids_np.copy()
        filled[:, :, 1:] = np.where(k <= run1[..., None], labels_np, mask_id)
        pred2, _ = predict(draft, target, head, mx.array(filled), feats, anchors)
        runs["oracle"] = leading(((k <= run1[..., None]) | (pred2 == labels_np)) & valid)
        for t in thresholds:
            r = leading(prob1 >= t)  # pass 1's confident prefix, right or wrong
            filled = ids_np.copy()
            filled[:, :, 1:] = np.where(k <= r[..., None], pred1, mask_id)
            pred2, _ = predict(draft, target, head, mx.array(filled), feats, anchors)
            final = np.where(k <= r[..., None], pred1, pred2)
            runs[f"threshold_{t}"] = leading((final == labels_np) & valid)
        for arm, run in runs.items():
            for n, c in walk_cycles(run, data, idx, args.max_len):
                totals[arm][0] += n
                totals[arm][1] += c
        done += len(idx)
        print(f"{done}/{len(data)} " + " ".join(
            f"{a} {n / max(c, 1):.3f}" for a, (n, c) in totals.items()),
            file=sys.stderr, flush=True)
    print(json.dumps({
        "draft": draft_path, "max_tokens": max_tokens, "prompts": len(data),
        "response_tokens": data.response_tokens(),
        "tau_est": {a: round(n / max(c, 1), 3) for a, (n, c) in totals.items()},
        "cycles": {a: c for a, (n, c) in totals.items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }), flush=True)


if __name__ == "__main__":
    main()
