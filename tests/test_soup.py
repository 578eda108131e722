"""`python -m mlx_dflash.train.soup`: a weighted average of drafters' weights."""

import json
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from helpers import write, zlab_config, zlab_weights
from mlx.utils import tree_flatten

from mlx_dflash.draft import load_draft
from mlx_dflash.train.soup import main


def two_drafters(tmp_path):
    a = zlab_weights()
    b = {k: v * 3 + 1 for k, v in a.items()}  # a different drafter of the same config
    pa = write(tmp_path / "a", zlab_config(), a)
    (pa / "draft_vocab.json").write_text(json.dumps([0, 1, 2]))
    return pa, write(tmp_path / "b", zlab_config(), b), a, b


def test_soup_is_the_weighted_average_and_keeps_the_first_vocab(tmp_path):
    pa, pb, a, b = two_drafters(tmp_path)
    main([str(tmp_path / "s"), str(pa), str(pb), "--weights", "1,3"])
    got = dict(tree_flatten(load_draft(tmp_path / "s").parameters()))
    assert set(got) == set(a)
    for k in a:
        want = 0.25 * np.array(a[k]) + 0.75 * np.array(b[k])
        np.testing.assert_allclose(np.array(got[k]), want, rtol=1e-6, atol=1e-6)
        assert got[k].dtype == mx.float32
    assert json.loads((tmp_path / "s" / "draft_vocab.json").read_text()) == [0, 1, 2]
    # Equal weights by default; a drafter averaged with itself is itself.
    main([str(tmp_path / "t"), str(pa), str(pa)])
    same = dict(tree_flatten(load_draft(tmp_path / "t").parameters()))
    for k in a:
        np.testing.assert_array_equal(np.array(same[k]), np.array(a[k]))


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--weights", "1"], "--weights has 1 values for 2 drafters"),
        (["--weights", "1,-1"], "non-negative"),
        (["--weights", "a,b"], "is not a comma-separated list"),
    ],
)
def test_soup_bad_weights_are_one_line(tmp_path, extra, says):
    pa, pb, _, _ = two_drafters(tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "mlx_dflash.train.soup", str(tmp_path / "s"), str(pa), str(pb), *extra],
        capture_output=True, text=True,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr
    assert not (tmp_path / "s").exists()


def test_soup_refuses_drafters_of_other_configs(tmp_path):
    pa, _, a, _ = two_drafters(tmp_path)
    pc = write(tmp_path / "c", zlab_config(num_target_layers=5), a)
    r = subprocess.run(
        [sys.executable, "-m", "mlx_dflash.train.soup", str(tmp_path / "s"), str(pa), str(pc)],
        capture_output=True, text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: drafter {pc}'s config.json differs from {pa}'s"]
    assert not (tmp_path / "s").exists()
