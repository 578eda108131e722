"""Probe: does averaging two drafters' weights beat both? (issue #23)

    python bench/probes/probe_soup.py DRAFT_A DRAFT_B MAX_TOKENS [W ...] [--model GGUF] [--dtype D]

Two fine-tunes of one drafter (stage 13 is stage 12 fine-tuned) often sit in
one basin, where their average can beat either (Wortsman et al. 2022, "model
soups"). The natural held-out set, answered greedily by the target (default:
the default target; float32 unless --dtype; at most MAX_TOKENS new tokens),
is scored for each
(1 - W) * A + W * B (default W: 0, 0.5, 1) with `trainer.estimate_tau`
(greedy decoding's tau walked from one teacher-forced pass, over the whole
vocabulary), overall and by category. One JSON line a W.
"""

import argparse
import json
import sys
import time

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402
from mlx_dflash.draft import load_draft  # noqa: E402
from mlx_dflash.train.cli import load_target  # noqa: E402
from mlx_dflash.train.data import generate_responses  # noqa: E402
from mlx_dflash.train.evaluate import natural_held_out, natural_kinds  # noqa: E402
from mlx_dflash.train.prompts import encode_prompt  # noqa: E402
from mlx_dflash.train.soup import mix  # noqa: E402
from mlx_dflash.train.trainer import TrainArgs, estimate_tau, tau_by  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("max_tokens", type=int)
    p.add_argument("w", type=float, nargs="*", default=[0.0, 0.5, 1.0])
    p.add_argument("--model", default=None, help="the target (default: the default one)")
    p.add_argument("--dtype", default="float32")
    args_ = p.parse_args()
    path_a, path_b, max_tokens, ws = args_.a, args_.b, args_.max_tokens, args_.w
    target, tok = load_target(args_.model, args_.dtype)
    a = load_draft(path_a, target=target, dtype=mx.float32)
    b = load_draft(path_b, target=target, dtype=mx.float32)
    pa, pb = a.parameters(), b.parameters()
    target.set_capture_layers(a.args.target_layer_ids)
    ids = [encode_prompt(tok, p) for p in natural_held_out()]
    t0 = time.perf_counter()
    data = generate_responses(
        target, ids, stop_tokens=sorted(tok.eos_token_ids), max_tokens=max_tokens,
        batch_size=len(ids), min_response=1,
    )
    print(f"answers: {len(data)}, {data.response_tokens()} tokens, "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    kinds = natural_kinds(tok, data)
    args = TrainArgs(batch_size=8, batch_tokens=4096, max_len=8192)
    for w in ws:
        t0 = time.perf_counter()
        a.update(mix([pa, pb], [1 - w, w]))
        est = estimate_tau(a, target, data, args)
        print(json.dumps({
            "a": path_a, "b": path_b, "w_b": w, "max_tokens": max_tokens,
            "prompts": len(data), "response_tokens": data.response_tokens(),
            "tau_est": round(est["tau_est"], 3), "first": round(est["first"], 4),
            "cycles": est["cycles"],
            "by_category": tau_by(kinds, est["per_sequence"]),
            "seconds": round(time.perf_counter() - t0, 1),
        }), flush=True)


if __name__ == "__main__":
    main()
