"""Probe: does the trainer's teacher-forced tau estimate track decoded tau? (issue #23)

    python bench/probes/probe_tau_estimate.py DATA.npz DRAFT [DRAFT ...]

DATA.npz: the target's greedy answers to prompts of the natural held-out set
(a `Dataset`; each sequence's category is found by its prompt). For each
drafter, `trainer.estimate_tau` (greedy decoding's tau walked from one
teacher-forced pass) over all of DATA and per category, float32 on this CPU.
One JSON line a drafter; set the lines beside the drafters' decoded tau from
`train --eval-only` on the same prompts.
"""

import json
import sys

from mlx_dflash.cli import use_blas

use_blas("auto")

import mlx.core as mx  # noqa: E402

from mlx_dflash.draft import load_draft  # noqa: E402
from mlx_dflash.train.cli import load_target  # noqa: E402
from mlx_dflash.train.data import Dataset  # noqa: E402
from mlx_dflash.train.evaluate import natural_kinds  # noqa: E402
from mlx_dflash.train.trainer import TrainArgs, estimate_tau, tau_by  # noqa: E402


def main():
    data_path, drafts = sys.argv[1], sys.argv[2:]
    target, tok = load_target(None, "float32")
    data = Dataset.load(data_path)
    cat = natural_kinds(tok, data)
    args = TrainArgs(batch_size=8, batch_tokens=4096, max_len=8192)
    for path in drafts:
        draft = load_draft(path, target=target, dtype=mx.float32)
        target.set_capture_layers(draft.args.target_layer_ids)
        est = estimate_tau(draft, target, data, args)
        row = {"draft": path, "tau_est": round(est["tau_est"], 3), "cycles": est["cycles"],
               "first": round(est["first"], 4)}
        row.update(tau_by(cat, est["per_sequence"]))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
