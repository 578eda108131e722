"""The memory guard: its estimate matches real cache bytes; it refuses what does
not fit, in the library, the CLI and the server, before allocating."""

import httpx
import mlx.core as mx
import pytest
from helpers import LiveServer, random_provider, run_cli
from mlx_lm.models.cache import ArraysCache, KVCache
from models import VOCAB, tiny_model

from mlx_dflash.decode import generate_step
from mlx_dflash.load import make_drafter
from mlx_dflash.memory import (
    available_memory,
    check_memory,
    meminfo_available,
    memory_model,
)
from mlx_dflash.target import Target


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_estimate_matches_real_cache_bytes(draft_dir, family):
    target = Target(tiny_model(family))
    drafter, _ = make_drafter(draft_dir, target, dtype=mx.float32)
    prompt = [3 + (i * 7) % (VOCAB - 4) for i in range(300)]
    max_tokens, block = 40, 16
    cache = target.make_cache(bucket=False)
    for _ in generate_step(
        target, prompt, drafter, cache=cache, max_tokens=max_tokens, block_size=block
    ):
        pass
    mx.eval([c.state for c in cache])
    est = memory_model(target, drafter).estimate(
        len(prompt), max_tokens, block_size=block
    )
    kv = sum(c.nbytes for c in cache if isinstance(c, KVCache))
    gdn = sum(c.nbytes for c in cache if isinstance(c, ArraysCache))
    draft_kv = sum(c.nbytes for c in drafter.cache)
    # Caches grow in 256-token steps: allow one step per layer.
    per_token = memory_model(target, drafter)
    assert abs(est.target_kv - kv) <= 256 * per_token.kv_per_token
    assert abs(est.draft_kv - draft_kv) <= 256 * per_token.draft_kv_per_token
    assert kv > 0 and draft_kv > 0
    assert est.gdn_state == gdn
    assert (gdn > 0) == (family == "qwen3_5")


def test_refuses_what_does_not_fit(draft_dir):
    target = Target(tiny_model("qwen3"))
    drafter, _ = make_drafter(draft_dir, target)
    est = memory_model(target, drafter).estimate(100_000, 100_000)
    check_memory(est, None)  # unknown budget: no refusal
    check_memory(est, est.new)
    with pytest.raises(ValueError) as err:
        check_memory(est, est.new - 1)
    assert "not enough memory for 200016 tokens" in str(err.value)
    assert "\n" not in str(err.value)


def test_available_memory_sources():
    text = "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable:     512 kB\n"
    assert meminfo_available(text) == 512 * 1024
    active = mx.get_active_memory()
    metal = {"max_recommended_working_set_size": active + 5000}
    assert available_memory(metal, "metal") == 5000
    assert available_memory({"total_memory": active + 7}, "cuda") == 7
    assert available_memory({}, "cpu", limit=active + 3) <= 3


def test_generate_refuses_before_allocating(model_dir):
    proc = run_cli(
        "generate",
        *("--model", str(model_dir), "--draft", "lookup", "--prompt", "hello"),
        *("--max-tokens", "100000", "--max-memory-gb", "0.001"),
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("error: not enough memory for") and "\n" not in line


def test_serve_answers_400_when_memory_would_run_out():
    server = LiveServer(random_provider("qwen3"), max_memory=1)
    try:
        server.engine.config.max_memory = mx.get_active_memory() + (64 << 20)
        # A window that holds the max_tokens below: only memory can refuse it.
        server.engine.config.max_context = 100_000_000
        ok = server.openai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert ok.choices[0].message.content is not None
        r = server.openai.chat.completions.with_raw_response
        with pytest.raises(Exception) as err:
            r.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=10_000_000,
            )
        assert err.value.status_code == 400
        assert err.value.body["code"] == "insufficient_memory"
        assert "not enough memory" in err.value.body["message"]
        # The Anthropic SDK itself refuses such a max_tokens; post directly.
        reply = httpx.post(
            server.url + "/v1/messages",
            json={
                "model": "claude-x",
                "max_tokens": 10_000_000,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert reply.status_code == 400
        assert reply.json()["type"] == "error"
        assert "not enough memory" in reply.json()["error"]["message"]
    finally:
        server.close()
