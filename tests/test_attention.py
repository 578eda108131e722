"""Block attention as plain ops (attention.py) equals MLX's fused attention and
changes no token; the model instance stays stock outside `Target.forward`."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step as stock_generate_step
from helpers import PROMPT, N, make_drafter, random_dflash, run, setup
from models import tiny_model

from mlx_dflash.kernels.attention import BlockAttention, foldable, folded_attention
from mlx_dflash.cache import additive, bucket_mask
from mlx_dflash.draft import block_mask
from mlx_dflash.target import Target

MIRRORED_FAMILIES = ["llama", "qwen2", "qwen3"]


def assert_fold_equals_fused(q, k, v, mask, masked):
    """`folded_attention` equals MLX's fused attention with `mask` as given
    (boolean) or made additive."""
    if masked == "additive":
        mask = additive(mask, q.dtype)
    scale = q.shape[-1] ** -0.5
    ours = folded_attention(q, k, v, scale, mask)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    assert ours.shape == ref.shape
    assert mx.allclose(ours, ref, atol=1e-5).item()


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (4, 4)])
@pytest.mark.parametrize("masked", ["bool", "additive", None])
def test_folded_attention_equals_fused(heads, kv_heads, masked):
    mx.random.seed(0)
    L, S, D, offset = 16, 96, 32, 70
    q = mx.random.normal((1, heads, L, D))
    k = mx.random.normal((1, kv_heads, S, D))
    v = mx.random.normal((1, kv_heads, S, D))
    mask = bucket_mask(L, offset, S) if masked else None
    assert_fold_equals_fused(q, k, v, mask, masked)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2), (3, 3)])
@pytest.mark.parametrize("L", [1, 5])
@pytest.mark.parametrize("masked", ["bool", "additive"])
def test_folded_attention_with_per_row_masks_equals_fused(heads, kv_heads, L, masked):
    """Rows of their own visible keys (a left-padded batch's, as the data
    generator decodes): a (B, 1, L, S) mask."""
    mx.random.seed(1)
    B, S, D = 3, 40, 16
    q = mx.random.normal((B, heads, L, D))
    k = mx.random.normal((B, kv_heads, S, D))
    v = mx.random.normal((B, kv_heads, S, D))
    pad = mx.array([0, 7, 23])[:, None, None]
    keys = mx.arange(S)[None, None]
    query = mx.arange(S - L, S)[None, :, None]
    mask = ((keys >= pad) & (keys <= query))[:, None]
    assert_fold_equals_fused(q, k, v, mask, masked)


def test_data_generator_steps_take_the_fold_and_leave_the_model_stock():
    from mlx_dflash.kernels import attention
    from mlx_dflash.train.data import greedy_batch

    target = Target(tiny_model("llama"))
    calls = []
    fold = attention.folded_attention
    attention.folded_attention = lambda *a, **k: calls.append(1) or fold(*a, **k)
    try:
        greedy_batch(target, [[5, 6, 7], [8, 9, 10, 11, 12]], stop_tokens=[], max_tokens=4)
    finally:
        attention.folded_attention = fold
    assert len(calls) == 3 * len(target.layers)  # the 3 one-token steps
    assert all(type(l.self_attn).__name__ == "Attention" for l in target.layers)


def test_foldable_takes_only_blocks_at_long_context():
    q16 = mx.zeros((1, 4, 16, 8))
    k = mx.zeros((1, 2, 512, 8))
    mask = bucket_mask(16, 400, 512)
    assert foldable(q16, k, mask, from_keys=512)
    assert not foldable(q16, k, mask, from_keys=513)  # too few keys
    assert not foldable(mx.zeros((1, 4, 1, 8)), k, None, from_keys=0)  # one query
    assert not foldable(mx.zeros((1, 4, 65, 8)), k, None, from_keys=0)  # a prefill
    assert not foldable(q16, k, "causal", from_keys=0)
    assert not foldable(q16, k, mask[None, None], from_keys=0)  # batched masks


@pytest.mark.parametrize("family", MIRRORED_FAMILIES)
@pytest.mark.parametrize("kind", ["oracle", "dflash"])
def test_greedy_with_folded_block_attention_equals_stock(family, kind):
    """Every verify block attends with plain ops; partial acceptances throughout."""
    model, ref = setup(family)
    target = Target(model, block_attention_from=0)
    assert len(target.fitting.attention) == target.num_layers
    drafter = make_drafter(kind, target, ref)
    if kind == "dflash":
        for layer in drafter.draft.layers:
            layer.self_attn.from_keys = 0
    cache = target.make_cache(bucket=True)
    out, stats = run(
        target, drafter, cache=cache, max_tokens=N, block_size=16, prefill_step_size=5
    )
    assert out == ref
    assert stats.cycles > 0


def test_qwen3_moe_with_folded_block_attention_equals_stock():
    """The one mirrored class the shared test families do not include."""
    model = tiny_model("qwen3_moe")
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
    target = Target(model, block_attention_from=0)
    assert len(target.fitting.attention) == target.num_layers
    drafter = make_drafter("oracle", target, ref)
    out, _ = run(
        target,
        drafter,
        cache=target.make_cache(bucket=True),
        max_tokens=N,
        block_size=16,
        prefill_step_size=5,
    )
    assert out == ref


@pytest.mark.parametrize("family", MIRRORED_FAMILIES)
def test_wrapper_is_on_only_inside_forward(family):
    model, _ = setup(family)
    target = Target(model, block_attention_from=0)
    stock = [type(layer.self_attn) for layer in model.model.layers]
    assert BlockAttention not in stock
    cache = target.make_cache(bucket=True)
    target.forward(mx.array([PROMPT]), cache)
    assert [type(layer.self_attn) for layer in model.model.layers] == stock


def test_unmirrored_layers_are_left_alone():
    model, _ = setup("qwen3_5")  # gated full attention + GatedDeltaNet
    assert Target(model, block_attention_from=0).fitting.attention == []


def test_default_is_off_on_cpu():
    model, _ = setup("qwen3")
    if mx.cuda.is_available():
        pytest.skip("the default is on under CUDA")
    assert Target(model).fitting.attention == []


def test_draft_folded_equals_fused():
    model, _ = setup("qwen3")
    target = Target(model)
    drafter = random_dflash(target)
    cache = target.make_cache(bucket=True)
    _, features = target.forward(mx.array([PROMPT]), cache)
    drafter.commit(PROMPT, features)
    fused = drafter.draft(target.embed(mx.array([[5] * 16])), drafter.cache)
    for layer in drafter.draft.layers:
        layer.self_attn.from_keys = 0
    folded = drafter.draft(target.embed(mx.array([[5] * 16])), drafter.cache)
    assert mx.allclose(folded, fused, atol=1e-5).item()
    # The context mask the draft hands attention is one the fold accepts.
    assert block_mask(16, len(PROMPT), 256, causal=False, window=None).ndim == 2
