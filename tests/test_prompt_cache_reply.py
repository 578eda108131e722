"""Agent-style turns reuse the previous prompt *and reply*, on attention and
hybrid models, with a byte-level BPE tokenizer.

A BPE tokenizer need not split a reply's text into the ids the model
generated, so matching the next prompt's ids stops inside the reply (and a
GatedDeltaNet cache, which can't be trimmed, at the previous prompt). The
server aligns by text instead: the next turn runs as the previous prompt's
ids + the reply's own ids + the rest tokenised. Each warm answer must equal
a cold run (`generate_step`, no cache) of exactly that token sequence.
"""

import random

import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from helpers import LiveServer, chat_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.target import Target

# chatml as SmolLM2 writes it: no tools branch, so tools use the generic format.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "def return class import self value list dict for in if else while try "
    "except print open file read write path name data result error test the a "
    "to of and is it that this with as on be at by not or from"
).split()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def bpe_tokenizer() -> TokenizerWrapper:
    """A byte-level BPE (ASCII corpus, ~600 ids) with chatml special tokens."""
    rng = random.Random(0)
    corpus = [
        " ".join(rng.choice(WORDS) for _ in range(30)) + "(x): y = [1, 2]\n"
        for _ in range(400)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", chat_template=TEMPLATE
    )
    return TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer)


def client_text(tok, ids) -> str:
    """The text a client is sent for `ids` (the server's streaming detokenizer)."""
    d = tok.detokenizer
    d.reset()
    for t in ids:
        d.add_token(t)
    d.finalize()
    return d.text


def text_of(tok, messages) -> str:
    from mlx_dflash.server.tools import generic_messages

    return tok.apply_chat_template(
        generic_messages(messages, TOOLS), add_generation_prompt=True, tokenize=False
    )


def run_turns(family: str, turns: int = 4, check: bool = True, max_batch: int = 1) -> list:
    """Agent-style turns against a live server (`--max-batch`); one row per turn.

    `check`: assert each answer equals a cold run of the spliced token
    sequence and turns >= 2 reuse >= 95% of the previous prompt + reply.
    """
    tok = bpe_tokenizer()
    target = Target(chat_model(family, len(tok), seed=1))
    srv = LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4), max_batch=max_batch)
    eos = tok.eos_token_ids
    rng = random.Random(family)
    rows, previous = [], 0
    ids, text = None, None  # the token sequence the server should run
    try:
        system = "You are a coding agent. " + " ".join(
            rng.choice(WORDS) for _ in range(300)
        )
        messages = [{"role": "system", "content": system}]
        for turn in range(turns):
            words = " ".join(rng.choice(WORDS) for _ in range(40))
            messages.append({"role": "user", "content": f"step {turn}: {words}"})
            new_text = text_of(tok, messages)
            r = srv.openai.chat.completions.create(
                model="tiny", messages=messages, tools=TOOLS, max_tokens=300
            )
            reply, usage = r.choices[0].message.content, r.usage
            cached = usage.prompt_tokens_details.cached_tokens
            rows.append(
                {
                    "turn": turn + 1,
                    "prompt_tokens": usage.prompt_tokens,
                    "canonical": len(tok.encode(new_text, add_special_tokens=False)),
                    "previous": previous,
                    "cached": cached,
                    "prefill_seconds": r.model_extra["mlx_dflash"]["prefill_seconds"],
                }
            )
            if check:
                if ids is None:
                    ids = tok.encode(new_text, add_special_tokens=False)
                else:
                    assert new_text.startswith(text)  # the reply rendered verbatim
                    rest = new_text[len(text) :]
                    ids = ids + tok.encode(rest, add_special_tokens=False)
                    assert cached >= 0.95 * previous, (turn, cached, previous)
                # Identical to a cold run of the same token sequence.
                out = []
                for t, _ in generate_step(
                    target,
                    ids,
                    PromptLookupDrafter(),
                    max_tokens=300,
                    block_size=4,
                    stop_tokens=eos,
                ):
                    out.append(t)
                assert reply == client_text(tok, [t for t in out if t not in eos])
                assert usage.prompt_tokens == len(ids)
                # The cache now holds ids + out[:-1]: the next turn aligns there
                # (cut by max_tokens, the last id and its text are not in it).
                cut = out[-1] not in eos
                text = new_text + (client_text(tok, out[:-1]) if cut else reply)
                ids = ids + out[:-1]
            previous = usage.prompt_tokens + usage.completion_tokens - 1
            messages.append({"role": "assistant", "content": reply})
    finally:
        srv.close()
    return rows


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_turns_reuse_the_previous_reply(family):
    run_turns(family)


def test_batched_turns_reuse_the_previous_reply():
    """The same through the batched engine (`--max-batch 2`), hybrid target."""
    run_turns("qwen3_5", max_batch=2)


def test_batched_replies_leave_true_cut_points():
    """A hybrid reply decoded by the batched engine (`--max-batch 2`) leaves
    its prompt-cache entry mid-reply cut points as the one-at-a-time engine
    does: at each, the GatedDeltaNet states copied are those of the entry's
    first n tokens run from scratch. (The points need not be at the same n:
    the batched engine runs fallback plain steps as one-token cycles, the
    one-at-a-time one as pipelined stretches.)"""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import ArraysCache

    tok = bpe_tokenizer()
    target = Target(chat_model("qwen3_5", len(tok), seed=1))
    messages = [{"role": "user", "content": "step 0: " + " ".join(WORDS[:30])}]
    for max_batch in (1, 2):
        srv = LiveServer(
            lambda: (target, tok, PromptLookupDrafter(), 4),
            max_batch=max_batch,
            reply_point_tokens=8,
        )
        try:
            r = srv.openai.chat.completions.create(
                model="tiny", messages=messages, max_tokens=60
            )
            assert r.usage.completion_tokens > 24
            entry = list(srv.engine.prompt_cache._entries.values())[-1]
        finally:
            srv.close()
        points = [p for p in entry.points if p.states]
        assert len(points) >= 2, max_batch
        for p in points:
            cache = target.make_cache()
            target.forward(mx.array([entry.tokens[: p.n]]), cache)
            ref = [c for c in cache if isinstance(c, ArraysCache)]
            assert len(ref) == len(p.states)
            for x, y in zip(ref, p.states):
                for u, v in zip(x.cache, y.cache):
                    np.testing.assert_allclose(np.array(u), np.array(v), atol=1e-4)


def main():
    """The table in bench/results/prompt_cache.md: cd tests && python test_prompt_cache_reply.py"""
    print("| model | turn | prompt tokens | canonical tokens | previous prompt + reply "
          "| cached | cached / previous | prefill s |")
    print("|---|---|---|---|---|---|---|---|")
    for family in ("llama", "qwen3_5"):
        for row in run_turns(family, check=False):
            share = row["cached"] / row["previous"] if row["previous"] else 0.0
            print(
                f"| {family} | {row['turn']} | {row['prompt_tokens']} | "
                f"{row['canonical']} | {row['previous']} | {row['cached']} | "
                f"{share:.1%} | {row['prefill_seconds']:.3f} |"
            )


if __name__ == "__main__":
    main()
