"""Multi-turn conversations reuse the prompt cache and still match a cold run.

Kept short for CPU CI; bench/results/prompt_cache.md has the ~8k-token,
4-turn measurement.
"""

import random

import pytest
from helpers import LiveServer, expected, random_provider

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def history(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_multi_turn_reuses_cache_and_matches_cold(family):
    srv = LiveServer(random_provider(family))
    try:
        messages = [{"role": "system", "content": history(120, 0)}]
        for turn in range(3):
            messages.append(
                {"role": "user", "content": f"turn {turn}: " + history(20, turn)}
            )
            r = srv.openai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=12
            )
            prompt = srv.engine.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True
            )
            tokens, text = expected(srv, prompt, 12)
            assert r.choices[0].message.content == text  # identical to a cold run
            cached = r.usage.prompt_tokens_details.cached_tokens
            info = r.model_extra["mlx_dflash"]
            if turn == 0:
                assert cached == 0
                cold = info["prefill_seconds"]
            else:
                # The whole previous turn (prompt and answer) came from the cache.
                assert cached >= prev, (cached, prev, len(prompt))
                assert info["prefill_seconds"] < cold
            messages.append({"role": "assistant", "content": text})
            prev = len(prompt) + len(tokens) - 1
    finally:
        srv.close()


def test_billing_nonce_does_not_defeat_the_cache():
    srv = LiveServer(random_provider("qwen3_5"))
    try:

        def ask(nonce):
            return srv.anthropic.messages.create(
                model="claude-local",
                max_tokens=4,
                system=[
                    {
                        "type": "text",
                        "text": "x-anthropic-billing-header: cc_version="
                        f"2.1.1.{nonce}; cc_entrypoint=cli; cch={nonce}00;",
                    },
                    {"type": "text", "text": history(80, 1)},
                ],
                messages=[{"role": "user", "content": "hello"}],
            )

        assert ask("aaa").usage.cache_read_input_tokens == 0
        assert ask("bbb").usage.cache_read_input_tokens > 400
    finally:
        srv.close()


def measure(family: str, n_words: int, turns: int, max_tokens: int = 16):
    """Warm (cached) vs cold prefill per turn through the HTTP server."""
    warm = LiveServer(random_provider(family), max_context=1 << 20)
    cold = LiveServer(
        random_provider(family), max_context=1 << 20, prompt_cache_bytes=0
    )
    rows = []
    try:
        messages = [{"role": "system", "content": history(n_words, 0)}]
        for turn in range(turns):
            messages.append(
                {"role": "user", "content": f"turn {turn}: " + history(20, turn)}
            )
            rw = warm.openai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=max_tokens
            )
            rc = cold.openai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=max_tokens
            )
            assert rw.choices[0].message.content == rc.choices[0].message.content
            tw = rw.model_extra["mlx_dflash"]["prefill_seconds"]
            tc = rc.model_extra["mlx_dflash"]["prefill_seconds"]
            rows.append(
                (
                    family,
                    turn + 1,
                    rw.usage.prompt_tokens,
                    rw.usage.prompt_tokens_details.cached_tokens,
                    tc,
                    tw,
                    tw / tc,
                )
            )
            messages.append(
                {"role": "assistant", "content": rw.choices[0].message.content}
            )
    finally:
        warm.close()
        cold.close()
    return rows


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="prompt-cache benchmark (not run in CI)")
    p.add_argument(
        "--words", type=int, default=1300, help="system-prompt words (~6 tokens each)"
    )
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--families", default="llama,qwen3_5")
    a = p.parse_args()
    print(
        "| model | turn | prompt tokens | cached | cold prefill s | warm prefill s | warm/cold |"
    )
    print("|---|---|---|---|---|---|---|")
    for fam in a.families.split(","):
        measure(fam, 50, 1)  # warm-up: first-shape compiles
        for r in measure(fam, a.words, a.turns):
            print("| %s | %d | %d | %d | %.3f | %.4f | %.1f%% |" % (*r[:6], 100 * r[6]))
