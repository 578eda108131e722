"""The branches only Apple's Metal backend takes, run on a CPU.

Two seams are faked, nothing else: `mx` as `device.py` reads it (so `backend()`
says "metal" and `device_info()` returns an Apple chip's dict), and `mx` as
mlx_lm's gated_delta dispatch reads it (so `gated_delta_update` picks its Metal
kernel), with that kernel swapped for its ops equivalent under the kernel's own
input/output contract. Everything downstream (drafter dtype policy, traps,
memory guard, GatedDeltaNet verify and rollback) is the product code as it
runs on a Mac.
"""

import copy
import json
import types

import mlx.core as mx
import numpy as np
import pytest
from helpers import PROMPT, LiveServer, random_provider
from mlx.utils import tree_map
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models import gated_delta as mlx_gated_delta
from mlx_lm.utils import _get_classes
from models import CONFIGS, VOCAB

from mlx_dflash import device, doctor, generate, rollback
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import OracleDrafter
from mlx_dflash.memory import available_memory, memory_model
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target

GiB = 1 << 30
M1 = {
    "architecture": "applegpu_g13s",
    "device_name": "Apple M1 Max",
    "memory_size": 32 * GiB,
    "max_recommended_working_set_size": 21 * GiB,
}
M3 = {
    "architecture": "applegpu_g15s",
    "device_name": "Apple M3 Pro",
    "memory_size": 36 * GiB,
    "max_recommended_working_set_size": 27 * GiB,
}


def metal_mx(info=None):
    """`mlx.core` as a process on an Apple GPU sees it: the default device is
    the GPU, Metal is available, `device_info()` is `info`. All else is real."""
    fake = types.SimpleNamespace(
        default_device=lambda: mx.gpu,
        metal=types.SimpleNamespace(is_available=lambda: True),
        cuda=types.SimpleNamespace(is_available=lambda: False),
        device_info=lambda: dict(info or {}),
    )

    class Proxy(types.ModuleType):
        def __getattr__(self, name):
            return getattr(fake, name) if hasattr(fake, name) else getattr(mx, name)

    return Proxy("mlx.core")


@pytest.fixture
def on_metal(monkeypatch):
    """Fake an Apple chip at device.py's one seam; returns the setter."""

    def use(info):
        monkeypatch.setattr(device, "mx", metal_mx(info))

    return use


# ---- device and chip detection, drafter dtype policy --------------------------------


def test_backend_and_chip_detection(on_metal):
    on_metal(M1)
    assert device.backend() == "metal"
    info = device.device_info()
    assert info["device_name"] == "Apple M1 Max"
    assert device.apple_chip(info) == 1 and not device.native_bf16(info, "metal")
    on_metal(M3)
    assert device.apple_chip(device.device_info()) == 3
    # An unknown (newer) chip is assumed to have bf16.
    on_metal({"device_name": "Apple GPU"})
    assert device.native_bf16(device.device_info(), device.backend())


def test_doctor_on_an_m1(on_metal):
    on_metal(M1)
    r = doctor.collect(measure_blas=False)
    assert r["backend"] == "metal" and r["apple_chip"] == 1
    assert r["native_bf16"] is False
    assert r["draft_dtype"] == "float32" and "Apple M1" in r["draft_dtype_reason"]
    assert r["memory_total"] == 32 * GiB
    assert r["memory_available"] == 21 * GiB - mx.get_active_memory()
    assert any("bf16 is emulated" in t for t in r["traps"])
    assert "Apple M1" in doctor.format_text(r)


@pytest.mark.parametrize(
    "info, dtype, reason",
    [(M1, "float32", "Apple M1 has no native bf16"), (M3, "bfloat16", "native bf16")],
)
def test_generate_runs_the_drafter_in_the_chips_dtype(
    on_metal, capsys, model_dir, draft_dir, info, dtype, reason
):
    on_metal(info)
    generate.main(
        [
            *("--model", str(model_dir), "--draft", draft_dir, "--prompt", "hello"),
            *("--max-tokens", "8", "--json", "--verbose"),
        ]
    )
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["draft_dtype"] == dtype
    assert reason in result["draft_dtype_reason"]
    assert f"drafter dtype {dtype}" in out.err
    # Emulated bf16 is named only where it is emulated.
    assert ("bf16 is emulated" in out.err) == (info is M1)


# ---- memory queries -----------------------------------------------------------------


def test_available_memory_is_the_working_set(on_metal):
    on_metal(M3)
    info, where = device.device_info(), device.backend()
    active = mx.get_active_memory()
    assert available_memory(info, where) == 27 * GiB - active
    assert available_memory(info, where, limit=active + 5) == 5
    # No working-set size reported: /proc/meminfo (here) or unknown, never 0.
    assert available_memory({}, "metal") != 0


def test_estimate_on_metal_leaves_out_materialized_scores():
    from models import tiny_model

    target = Target(tiny_model("qwen3"))
    model = memory_model(target)
    cpu = model.estimate(2000, 100, backend="cpu")
    metal = model.estimate(2000, 100, backend="metal")
    assert metal.target_kv == cpu.target_kv and metal.transient < cpu.transient


def test_generate_refuses_beyond_the_working_set(on_metal, model_dir):
    on_metal(dict(M3, max_recommended_working_set_size=mx.get_active_memory() + 1000))
    with pytest.raises(SystemExit) as exit:
        generate.main(
            [
                *("--model", str(model_dir), "--draft", "lookup", "--prompt", "hi"),
                *("--max-tokens", "100000"),
            ]
        )
    assert exit.value.code == 2


def test_server_refuses_beyond_the_working_set(on_metal):
    room = mx.get_active_memory() + (64 << 20)
    on_metal(dict(M3, max_recommended_working_set_size=room))
    server = LiveServer(random_provider("qwen3"), max_context=100_000_000)
    try:
        assert server.engine.device[1] == "metal"
        messages = [{"role": "user", "content": "hi"}]
        ok = server.openai.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4
        )
        assert ok.choices[0].message.content is not None
        with pytest.raises(Exception) as err:
            server.openai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=10_000_000
            )
        assert err.value.status_code == 400
        assert err.value.body["code"] == "insufficient_memory"
    finally:
        server.close()


# ---- mlx_lm's GatedDeltaNet Metal kernel in verify and rollback ---------------------


def metal_gdn_model():
    """models.py's tiny qwen3_5 with key heads of 32: the Metal kernel's minimum."""
    config = copy.deepcopy(CONFIGS["qwen3_5"])
    config["text_config"].update(linear_key_head_dim=32, linear_value_head_dim=16)
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(0)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * 3.0 if p.ndim == 2 else p, model.parameters()))
    model.set_dtype(mx.float32)
    model.eval()  # as mlx_lm.load leaves it: the layers ask for the kernel
    mx.eval(model.parameters())
    return model


@pytest.fixture
def metal_gdn(monkeypatch):
    """mlx_lm's dispatch sees a Metal GPU; its kernel is the ops path under the
    kernel's contract. Returns the list of (phase, T) of every kernel call."""
    calls, phase = [], ["forward"]

    def kernel(q, k, v, g, beta, state, mask=None):
        B, T, Hk, Dk = k.shape
        Hv, Dv = v.shape[2:]
        assert q.shape == k.shape and v.shape[:2] == (B, T) and Hv % Hk == 0
        assert Dk % 32 == 0 and g.shape[:3] == (B, T, Hv) and beta.shape == (B, T, Hv)
        assert state.shape == (B, Hv, Dv, Dk)
        assert mask is None or mask.shape == (B, T)
        calls.append((phase[0], T))
        y, s = mlx_gated_delta.gated_delta_ops(q, k, v, g, beta, state, mask)
        return y.astype(q.dtype), s.astype(state.dtype)  # the kernel's out dtypes

    real_replay = rollback.gated_delta

    def replay(*args, **kw):
        phase[0] = "rollback"
        try:
            return real_replay(*args, **kw)
        finally:
            phase[0] = "forward"

    monkeypatch.setattr(mlx_gated_delta, "mx", metal_mx())
    monkeypatch.setattr(mlx_gated_delta, "gated_delta_kernel", kernel)
    monkeypatch.setattr(rollback, "gated_delta", replay)
    return calls


def test_verify_and_rollback_through_the_metal_kernel(metal_gdn):
    model = metal_gdn_model()
    ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=40)]
    metal_gdn.clear()  # the reference ran the kernel too; count ours only
    target = Target(model)
    # Rejects at every draft position in turn: rollbacks keep 0..B-1 steps.
    drafter = OracleDrafter(PROMPT + ref, vocab_size=VOCAB, schedule=list(range(8)))
    stats = SpecStats(8)
    out = [
        t
        for t, _ in generate_step(
            target, PROMPT, drafter, max_tokens=40, block_size=8, stats=stats
        )
    ]
    assert out == ref
    verify = [T for p, T in metal_gdn if p == "forward" and 1 < T <= 8]
    replays = [T for p, T in metal_gdn if p == "rollback"]
    layers = len(target.delta_taps)
    assert len(verify) >= layers * stats.cycles // 2 and 8 in verify
    assert replays and all(1 <= T < 8 for T in replays)
    assert len(set(replays)) > 2  # kept lengths vary with the rejection point


def test_rollback_replay_equals_a_plain_run_of_the_kept_steps(metal_gdn):
    """The Metal replay leaves the state a forward of only the kept tokens makes."""
    from mlx_dflash.rollback import snapshot

    model = metal_gdn_model()
    target = Target(model)
    block = mx.array([[4, 8, 15, 16, 23, 42]]) % VOCAB
    for kept in (1, 3, 5):
        cache = target.make_cache()
        target.forward(mx.array([PROMPT]), cache)
        saved = snapshot(cache, target.delta_taps)
        target.forward(block, cache)
        rollback.rollback(
            cache, target.delta_taps, saved, verified=block.shape[1], kept=kept
        )
        plain = target.make_cache()
        target.forward(mx.array([PROMPT]), plain)
        target.forward(block[:, :kept], plain)
        for i in target.delta_taps:
            for j in (0, 1):  # conv state, recurrent state
                np.testing.assert_allclose(
                    np.array(cache[i][j]), np.array(plain[i][j]), atol=1e-5
                )
    assert any(p == "rollback" for p, _ in metal_gdn)
