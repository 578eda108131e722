"""Probe: are requests the target writes itself as hard for the drafter as people's? (issue #23)

    python bench/probes/probe_self_requests.py N MAX_TOKENS DRAFT [SEED]

Three sets of N prompts, answered greedily by the default target (float32, this
CPU) with at most MAX_TOKENS new tokens: the natural held-out set (hand-written,
its categories in turn), the training generator's natural requests of a seed no
stage drew (version 6 of the pieces), and requests the target writes itself
(`self_requests.py`, the same seed). For each, `trainer.estimate_tau` of DRAFT
(greedy decoding's tau walked from one teacher-forced pass). If the target's
own requests score like the hand-written ones rather than like the
generator's, they stand where the drafter falls short, which is what training
on them (`train --self-requests`) needs. One JSON line a set.
"""

import json
import sys
import time

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402

from mlx_dflash.draft import load_draft  # noqa: E402
from mlx_dflash.train.cli import load_target  # noqa: E402
from mlx_dflash.train.data import generate_responses  # noqa: E402
from mlx_dflash.train.evaluate import natural_held_out  # noqa: E402
from mlx_dflash.train.natural import natural_prompts  # noqa: E402
from mlx_dflash.train.prompts import encode_prompt  # noqa: E402
from mlx_dflash.train.self_requests import self_requests  # noqa: E402
from mlx_dflash.train.trainer import TrainArgs, estimate_tau  # noqa: E402


def in_turn(prompts, n):
    """The first n of `prompts`, taking their kinds in turn."""
    by_kind = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    out, i = [], 0
    while len(out) < n and any(i < len(v) for v in by_kind.values()):
        out += [v[i] for v in by_kind.values() if i < len(v)][: n - len(out)]
        i += 1
    return out


def main():
    n, max_tokens, draft_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 777
    target, tok = load_target(None, "float32")
    draft = load_draft(draft_path, target=target, dtype=mx.float32)
    target.set_capture_layers(draft.args.target_layer_ids)
    held = natural_held_out()
    t0 = time.perf_counter()
    own = self_requests(target, tok, 2 * n, seed=seed, batch_size=2 * n, held_out=held)
    print(f"self requests: {len(own)} of {2 * n} kept, {time.perf_counter() - t0:.0f}s",
          file=sys.stderr, flush=True)
    sets = {
        "hand_written": in_turn(held, n),
        "generator_unseen": in_turn(natural_prompts(20 * n, seed=seed, pieces=6), n),
        "self_written": in_turn(own, n),
    }
    args = TrainArgs(batch_size=8, batch_tokens=4096, max_len=8192)
    stops = sorted(tok.eos_token_ids)
    for name, prompts in sets.items():
        t0 = time.perf_counter()
        data = generate_responses(
            target, [encode_prompt(tok, p) for p in prompts], stop_tokens=stops,
            max_tokens=max_tokens, batch_size=len(prompts), min_response=1,
        )
        est = estimate_tau(draft, target, data, args)
        print(json.dumps({
            "set": name, "draft": draft_path, "prompts": len(prompts), "seed": seed,
            "max_tokens": max_tokens, "tau_est": round(est["tau_est"], 3),
            "first": round(est["first"], 4), "cycles": est["cycles"],
            "response_tokens": data.response_tokens(),
            "kinds": sorted({p.kind for p in prompts}),
            "seconds": round(time.perf_counter() - t0, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
