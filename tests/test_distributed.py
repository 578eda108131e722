"""Two ranks on this machine (`mlx.launch -n 2 --backend ring`, CPU) against one process.

The target is split by mlx_lm's tensor-parallel `shard` (tiny llama: tied
head, KV heads split; tiny qwen3_5: hybrid with Hv != Hk, GatedDeltaNet heads
split, untied head split by vocabulary). Each rank runs tests/distributed_ranks.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import write, zlab_config, zlab_weights
from mlx_lm.generate import generate_step as stock_generate_step
from models import save_tiny_model_dir

import distributed_ranks as ranks
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.load import load_pair

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = Path(sys.executable).parent / "mlx.launch"
FAMILIES = ["llama", "qwen3_5"]


def launch(*cmd, timeout=240, **kw):
    """`mlx.launch -n 2 --backend ring -- CMD` with this checkout importable."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [str(LAUNCH), "-n", "2", "--backend", "ring", "--", *map(str, cmd)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny target directories and a z-lab DFlash checkpoint the ranks load."""
    root = tmp_path_factory.mktemp("dist")
    for family in FAMILIES:
        save_tiny_model_dir(family, root / family)
    write(root / "draft", zlab_config(), zlab_weights())
    return root


@pytest.fixture(scope="module")
def ranked(dirs):
    """What each rank of one 2-rank launch reported, per family."""
    script = Path(__file__).with_name("distributed_ranks.py")
    cmd = [sys.executable, script, dirs / "draft", dirs, *(dirs / f for f in FAMILIES)]
    done = launch(*cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        f: [json.loads((dirs / f"{f}.rank{r}.json").read_text()) for r in (0, 1)]
        for f in FAMILIES
    }


def one_process(dirs, family):
    """The same runs in this process, unsharded: stock greedy and our speculative runs."""
    pair = load_pair(str(dirs / family), str(dirs / "draft"))
    prompt = mx.array(ranks.PROMPT)
    stock = [t for t, _ in stock_generate_step(prompt, pair.target.model, max_tokens=ranks.N)]
    out = {"stock": stock}
    for name, drafter in (("dflash", pair.drafter), ("lookup", PromptLookupDrafter())):
        steps = generate_step(
            pair.target,
            ranks.PROMPT,
            drafter,
            max_tokens=ranks.N,
            block_size=8,
            sampling=ranks.SAMPLING,
        )
        out[f"{name}/sampled"] = [t for t, _ in steps]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_equal_one_process(dirs, ranked, family):
    ref = one_process(dirs, family)
    for r in ranked[family]:
        assert r["world"] == {"world_size": 2, "backend": "ring", "mode": "tensor"}
        # Each rank holds its own half of the heads (tiny models: 2 KV heads,
        # qwen3_5's GatedDeltaNet 4 value heads).
        assert r["kv_heads"] and set(r["kv_heads"]) == {1}
        assert r["delta_heads"] == ([2, 2, 2] if family == "qwen3_5" else [])
        assert r["stock"] == ref["stock"]  # sharding itself changes no token
        for name in ("dflash", "lookup", "oracle"):
            run = r[f"{name}/greedy"]
            assert run["tokens"] == ref["stock"], name
            assert run["cache_diff"] <= 1e-5, name
        for name in ("dflash", "lookup"):
            run = r[f"{name}/sampled"]
            assert run["tokens"] == ref[f"{name}/sampled"], name
            assert run["cache_diff"] <= 1e-5, name
