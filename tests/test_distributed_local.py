"""One-process checks of the distributed seams: the block-kernel seam keeps layers split by
mlx_lm's `shard` on the stock path; doctor and `/v1/models` report the group.

One process: `model.shard` over MLX's one-rank group gives the same layer types
and `sharding_group`s as a real split (mlx.nn.layers.distributed linears; for
qwen3_5 the GatedDeltaNet's own all_sum and the vocabulary-split head), so the
decision is checked with the backend faked at its one seam (test_linear.py's
OpsKernels, which counts launches).
"""

import mlx.core as mx
import pytest
from helpers import N, PROMPT, random_dflash, run
from mlx_lm.generate import generate_step as stock_generate_step
from models import tiny_model
from test_linear import OpsKernels

from mlx_dflash.kernels import BlockPath
from mlx_dflash.kernels.path import sharded
from mlx_dflash.target import Target


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_sharded_layers_take_no_block_kernel(family):
    model = tiny_model(family)
    model.shard(mx.distributed.init())
    assert all(sharded(layer) for layer in model.layers)
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
    path = BlockPath.choose(OpsKernels())
    target = Target(model, block_path=path)
    f = target.fitting
    assert not f.layers and not f.slots and not f.linears  # nothing in the target
    # A vocabulary-split head (qwen3_5) stays stock and is gathered; a tied
    # embedding head (llama) is no sharded layer.
    assert (f.head is None) == (family == "qwen3_5")
    out, stats = run(target, random_dflash(target), max_tokens=N, block_size=8)
    assert out == ref and stats.cycles > 0
    calls = path.ops.calls
    assert calls["qkv"] > 0  # the unsharded DFlash draft still takes its kernels
    assert not any(type(m).__name__.startswith("Block") for _, m in model.named_modules())


def test_unsharded_layers_keep_their_kernels():
    model = tiny_model("llama")
    assert not any(sharded(layer) for layer in model.layers)
    target = Target(model, block_path=BlockPath.choose(OpsKernels()))
    assert len(target.fitting.layers) == target.num_layers


def test_doctor_reports_the_group():
    from mlx_dflash import doctor

    g = doctor.collect(measure_blas=False)["distributed"]
    assert g["world_size"] == 1 and g["mode"] == "single" and g["rank"] == 0
    assert "ring" in g["backends_available"] and g["all_sum_us"] is None
    assert "distributed: world size 1" in doctor.format_text(doctor.collect(measure_blas=False))


def test_models_card_reports_one_process(srv):
    import httpx

    card = httpx.get(srv.url + "/v1/models").json()["data"][0]
    assert card["mlx_dflash"]["distributed"] == {
        "world_size": 1,
        "backend": None,
        "mode": "single",
    }
