"""The sampled cycle's shape and first-use costs: fixed-shape graphs, and after
`warm_up` a first sampled generation builds nothing new.

On the CPU backend the only thing built on first use is an `mx.compile`d
graph (mlx_lm's top-p / min-p / top-k, the models' activations), compiled to a
shared library per graph and row-count class and loaded into the process:
the libraries this process has mapped count what it has built or loaded.
"""

import os

import mlx.core as mx
import pytest
from helpers import PROMPT, random_dflash
from models import tiny_model

from mlx_dflash import sampling
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import OracleDrafter
from mlx_dflash.sampling import SamplingParams, log_weights, speculative_accept
from mlx_dflash.target import Target
from mlx_dflash.warmup import warm_up

BLOCK = 4

needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="counts libraries in /proc"
)


def compiled_kernels():
    """MLX's JIT-compiled CPU kernels mapped into this process."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if line.rstrip().endswith(".so")}
    return {p for p in paths if "/mlx/" in p and "/cpu/lib" in p}


def generate(target, drafter, params, max_tokens=2 * BLOCK + 3):
    steps = generate_step(
        target,
        PROMPT,
        drafter,
        max_tokens=max_tokens,
        block_size=BLOCK,
        sampling=params,
    )
    return [t for t, _ in steps]


@pytest.fixture(scope="module")
def pair():
    target = Target(tiny_model("llama"))
    return target, random_dflash(target)


# Values no other test uses, so their compiled graphs are new to this process.
FILTERED = SamplingParams(temperature=0.9, top_p=0.8125, min_p=0.0625, top_k=7)


@needs_proc
def test_without_warm_up_first_filtered_generation_compiles(pair):
    """The counter sees a first use: the check below is not vacuous."""
    target, drafter = pair
    params = SamplingParams(temperature=0.8, top_p=0.6875)  # unused elsewhere
    generate(target, drafter, SamplingParams(temperature=1.0, seed=0))  # models' own
    before = compiled_kernels()
    generate(target, drafter, params)
    assert compiled_kernels() - before


@needs_proc
@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), FILTERED], ids=["temp", "filtered"]
)
def test_after_warm_up_first_sampled_generation_compiles_nothing(pair, params):
    target, drafter = pair
    warm_up(target, drafter, BLOCK, [SamplingParams(), params])
    before = compiled_kernels()
    # A DFlash drafter (q from the drafter) and a one-hot one, every block
    # length down to the last token; a fresh seed: a different path.
    for seed in range(3):
        p = SamplingParams(**{**params.__dict__, "seed": seed})
        generate(target, drafter, p)
        generate(target, OracleDrafter(PROMPT, vocab_size=96, error_rate=0.5), p)
    assert compiled_kernels() == before


def test_sampling_warm_covers_every_row_count(monkeypatch):
    """Filtered settings trace per row count: all B of them (and a 1-D row)."""
    shapes = set()
    real = sampling.log_weights

    def spy(logits, params):
        shapes.add(logits.shape)
        return real(logits, params)

    monkeypatch.setattr(sampling, "log_weights", spy)
    sampling.warm(50, BLOCK, FILTERED, drafted=True)
    assert {(n, 50) for n in range(1, BLOCK + 1)} | {(50,)} <= shapes
    shapes.clear()
    sampling.warm(50, BLOCK, SamplingParams(temperature=1.0), drafted=True)
    assert {(1, 50), (BLOCK, 50)} <= shapes


@pytest.mark.parametrize("drafted", [False, True])
def test_accept_shapes_do_not_depend_on_the_accepted_length(drafted):
    """The accepted length is data, not a shape: one graph for every cycle.
    The emitted tokens are candidates[:a+1], the accepted drafts first, then
    a token other than the rejected draft (or the bonus draw)."""
    V, m = 64, BLOCK - 1
    logits = mx.random.normal((m + 1, V), key=mx.random.key(1)) * 3
    draft = mx.argmax(logits[:m], axis=-1).astype(mx.uint32)
    w = log_weights(logits, SamplingParams(temperature=1.0))
    q = None
    if drafted:
        noise = mx.random.normal((m, V), key=mx.random.key(2))
        q = log_weights(logits[:m] + noise, SamplingParams(temperature=1.0))
        draft = mx.random.categorical(q, key=mx.random.key(3)).astype(mx.uint32)
    lengths = set()
    for seed in range(40):
        accepted, candidates = speculative_accept(draft, q, w, mx.random.key(seed))
        assert accepted.shape == (m,) and candidates.shape == (m + 1,)
        a = 0
        while a < m and accepted[a].item():
            a += 1
        lengths.add(a)
        assert candidates[:a].tolist() == draft[:a].tolist()
        if a < m:
            assert candidates[a].item() != draft[a].item()
    assert len(lengths) > 2  # several accepted lengths, one shape


@pytest.mark.parametrize("on", [True, False])
def test_server_warms_before_it_reports_ready(monkeypatch, on):
    pytest.importorskip("fastapi")  # the server stack (absent on the CUDA machine)
    from helpers import random_provider

    from mlx_dflash.server import engine as engine_mod

    calls = []
    real = engine_mod.warm_up

    def spy(target, drafter, block_size, settings, **kw):
        calls.append((block_size, [s.temperature for s in settings]))
        real(target, drafter, block_size, settings, **kw)

    monkeypatch.setattr(engine_mod, "warm_up", spy)
    config = engine_mod.EngineConfig(default_temperature=0.5, warm_up=on)
    engine = engine_mod.Engine(random_provider(block_size=4), config).start()
    try:
        assert calls == ([(4, [0.0, 0.5, 1.0])] if on else [])
    finally:
        engine.stop()
