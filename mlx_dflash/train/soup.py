"""A weighted average of drafters' weights ("model soups", Wortsman et al. 2022).

Fine-tunes of one drafter from one start tend to stay in one basin, where the
average of their weights can draft better than either: stage 12 and its
fine-tune stage 13 reached natural held-out tau 2.581 / 2.587, their
half-and-half average 2.640 (bench/results/train_natural.md).

    python -m mlx_dflash.train.soup OUT DRAFT DRAFT [DRAFT ...] [--weights W,W,...]

OUT gets the average (equal weights unless `--weights`, which are normalized
to sum to 1), the first drafter's config.json and its draft_vocab.json if it
has one. The drafters must share one config: the same shapes and the same
target layers.
"""

import argparse
import shutil
from pathlib import Path
from typing import List, Optional, Sequence

import mlx.core as mx
from mlx.utils import tree_map

from ..draft import DFlashDraft, load_draft, read_config, save_draft


def mix(params: Sequence[dict], weights: Sequence[float]) -> dict:
    """sum_i weights[i] * params[i], leaf by leaf, summed in float32 and cast
    back to the first tree's dtypes (`weights` are used as given)."""
    def one(*leaves):
        acc = sum(w * x.astype(mx.float32) for w, x in zip(weights, leaves))
        return acc.astype(leaves[0].dtype)

    return tree_map(one, params[0], *params[1:])


def normalized(weights: Optional[Sequence[float]], n: int) -> List[float]:
    """`weights` (equal ones if None) scaled to sum to 1; a wrong count, a
    negative weight or a zero sum is a one-line ValueError."""
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise ValueError(f"--weights has {len(weights)} values for {n} drafters")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError("--weights must be non-negative and not all zero")
    return [w / sum(weights) for w in weights]


def soup(paths: Sequence[str], weights: Optional[Sequence[float]] = None) -> DFlashDraft:
    """The drafters at `paths` averaged with `weights` (see `normalized`),
    as a drafter of the first one's config and dtypes."""
    if len(paths) < 2:
        raise ValueError("a soup needs at least two drafters")
    ws = normalized(weights, len(paths))
    first = read_config(paths[0], "drafter")
    for p in paths[1:]:
        if read_config(p, "drafter") != first:
            raise ValueError(f"drafter {p}'s config.json differs from {paths[0]}'s")
    drafts = [load_draft(p) for p in paths]
    out = drafts[0]
    out.update(mix([d.parameters() for d in drafts], ws))
    mx.eval(out.parameters())
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m mlx_dflash.train.soup",
        description="average drafters' weights (fine-tunes of one start) into a new drafter",
    )
    p.add_argument("out", help="the new drafter's directory")
    p.add_argument("drafts", nargs="+", help="drafter checkpoint directories (at least two)")
    p.add_argument("--weights", default=None,
                   help="comma-separated weights, one a drafter (default: equal; normalized)")
    a = p.parse_args(argv)
    try:
        weights = [float(w) for w in a.weights.split(",")] if a.weights else None
    except ValueError:
        p.exit(2, f"error: --weights {a.weights!r} is not a comma-separated list of numbers\n")
    try:
        model = soup(a.drafts, weights)
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    out = Path(a.out)
    save_draft(model, out)
    vocab = Path(a.drafts[0]) / "draft_vocab.json"
    if vocab.is_file():
        shutil.copyfile(vocab, out / vocab.name)
    ws = normalized(weights, len(a.drafts))
    print(f"{out}: " + " + ".join(f"{w:.3g} x {d}" for w, d in zip(ws, a.drafts)))


if __name__ == "__main__":
    main()
