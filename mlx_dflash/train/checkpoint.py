"""Training checkpoints: the drafter in z-lab format (usable mid-run) and, in
`train_state/`, what resuming needs (fp32 weights, optimizer state, step,
schedule, data order, rng)."""

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..draft import save_draft


def save_state(out: Path, draft, opt, state: dict):
    """The drafter (z-lab format, usable mid-run) plus what resuming needs:
    fp32 weights, optimizer state, step, schedule, data order and rng."""
    save_draft(draft, out)
    # In a subdirectory: load_draft reads every *.safetensors file in `out`.
    (out / "train_state").mkdir(exist_ok=True)
    weights = {k: v.astype(mx.float32) for k, v in tree_flatten(draft.parameters())}
    mx.save_safetensors(str(out / "train_state" / "draft.safetensors"), weights)
    mx.save_safetensors(
        str(out / "train_state" / "optimizer.safetensors"),
        dict(tree_flatten(opt.state)),
    )
    with open(out / "train_state" / "trainer_state.json", "w") as f:
        json.dump(state, f)


def load_state(out: Path, draft, opt):
    with open(out / "train_state" / "trainer_state.json") as f:
        st = json.load(f)
    draft.load_weights(str(out / "train_state" / "draft.safetensors"))
    opt.state = tree_unflatten(
        list(mx.load(str(out / "train_state" / "optimizer.safetensors")).items())
    )
    return st


def train_finished(out) -> bool:
    """Whether the checkpoint in `out` completed its schedule (vs. stopped early)."""
    with open(Path(out) / "train_state" / "trainer_state.json") as f:
        st = json.load(f)
    return st["step"] >= st["total_steps"]
