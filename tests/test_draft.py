"""The DFlash draft model: z-lab checkpoints load and run; malformed ones fail clearly."""

import json

import mlx.core as mx
import numpy as np
import pytest
from helpers import H, write, zlab_config, zlab_weights
from models import VOCAB, tiny_model

from mlx_dflash.decode import generate_step
from mlx_dflash.draft import DFlashDraft, DraftArgs, load_draft, save_draft
from mlx_dflash.drafters import DFlashDrafter
from mlx_dflash.load import make_drafter
from mlx_dflash.target import Target


@pytest.fixture(scope="module")
def target():
    return Target(tiny_model("qwen3"))


def test_zlab_checkpoint_loads_and_runs(tmp_path, target):
    path = write(tmp_path / "ok", zlab_config(), zlab_weights())
    drafter, block = make_drafter(str(path), target)
    assert block == 16 and isinstance(drafter, DFlashDrafter)
    assert target.capture_layers == [1, 2]
    prompt = list(range(3, 20))
    out = [t for t, _ in generate_step(target, prompt, drafter, max_tokens=20)]
    plain = [
        t
        for t, _ in generate_step(target, prompt, drafter, max_tokens=20, block_size=1)
    ]
    assert out == plain and len(out) == 20
    # Sliding layer is causal + windowed, as in the reference.
    assert drafter.draft.layers[1].self_attn.window == 8
    assert drafter.draft.layers[0].self_attn.window is None


def test_save_round_trip(tmp_path, target):
    path = write(tmp_path / "a", zlab_config(), zlab_weights())
    draft = load_draft(path, target=target)
    save_draft(draft, tmp_path / "b")
    again = load_draft(tmp_path / "b", target=target)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["dflash_config"] == {
        "mask_token_id": VOCAB - 1,
        "target_layer_ids": [1, 2],
    }
    assert cfg["architectures"] == ["DFlashDraftModel"]
    feats = mx.random.normal((1, 5, 2 * H))
    block = mx.random.normal((1, 4, H))
    outs = []
    for d in (draft, again):
        cache = d.make_cache()
        d.append_context(feats, cache)
        outs.append(d(block, cache))
    assert mx.allclose(outs[0], outs[1]).item()


def test_context_cache_is_incremental(target):
    """Appending context in pieces equals appending it at once (the draft never rolls back)."""
    draft = DFlashDraft(DraftArgs.from_config(zlab_config()))
    draft.set_dtype(mx.float32)
    feats = mx.random.normal((1, 11, 2 * H))
    block = mx.random.normal((1, 16, H))
    one, two = draft.make_cache(), draft.make_cache()
    draft.append_context(feats, one)
    for s, e in [(0, 4), (4, 5), (5, 11)]:
        draft.append_context(feats[:, s:e], two)
    a, b = draft(block, one), draft(block, two)
    assert np.abs(np.array(a) - np.array(b)).max() < 1e-5
    assert one[0].offset == 11  # block K/V never enter the cache


def drop(d, key):
    d = dict(d)
    del d[key]
    return d


MALFORMED = {
    "missing weight": (
        zlab_config(),
        drop(zlab_weights(), "layers.1.mlp.up_proj.weight"),
        "missing weight 'layers.1.mlp.up_proj.weight'",
    ),
    "hidden size": (
        zlab_config(hidden_size=32),
        zlab_weights(),
        "draft hidden_size 32 != target hidden size 64",
    ),
    "no mask token": (
        zlab_config(dflash_config={"target_layer_ids": [1, 2]}),
        zlab_weights(),
        "no dflash_config.mask_token_id",
    ),
    "layer id range": (
        zlab_config(dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 7]}),
        zlab_weights(),
        "target_layer_ids entry 7 is out of range",
    ),
    "missing config key": (
        drop(zlab_config(), "num_attention_heads"),
        zlab_weights(),
        "missing 'num_attention_heads'",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_names_the_problem(tmp_path, target, case):
    cfg, weights, message = MALFORMED[case]
    path = write(tmp_path / "bad", cfg, weights)
    with pytest.raises(ValueError) as err:
        make_drafter(str(path), target)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_files(tmp_path, target):
    with pytest.raises(ValueError, match="no config.json"):
        load_draft(tmp_path, target=target)
    (tmp_path / "config.json").write_text(json.dumps(zlab_config()))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_draft(tmp_path, target=target)
