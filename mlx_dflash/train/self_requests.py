"""Requests the target writes itself: user turns sampled from the chat template.

An instruct model given its template up to the start of a user turn writes a
user's request, in the phrasing and on the subjects of the conversations it
was tuned on (Magpie: Xu et al. 2024, arXiv 2406.08464). For the default
drafter that is the nearest thing to people's own requests we can make
offline: the composed 'natural' requests are the generator's few hundred
pieces, and the drafter learned those (bench/results/train_natural.md, 26th
session: τ 3.0-3.1 on unseen draws of the generator, 2.4 on hand-written
requests whose answers are as predictable).

A seeded share of the turns is started with a few words (`STARTS`) so that
code, edits, math and explanations come up, not only chat; the target writes
the rest. Only turns the target ends itself are kept, deduplicated, and none
that shares a run of words with the natural held-out set.
"""

import random
from typing import List, Optional, Sequence

from .data import generate_responses
from .prompts import Prompt

_SENTINEL = "\x00REQUEST\x00"

# (category, the words a user turn starts with). The empty start, weighted
# by repetition, leaves the whole turn to the target.
STARTS = [("free", "")] * 12 + [
    ("code", "Write a Python function that"),
    ("code", "Write a function in JavaScript that"),
    ("code", "Can you write a program"),
    ("code", "How do I"),
    ("code", "I'm getting an error when I"),
    ("code", "Fix the bug in this code:\n\n```python\n"),
    ("code", "What does this code do?\n\n```"),
    ("code", "Refactor this code"),
    ("code", "Write unit tests for"),
    ("code", "Can you explain how"),
    ("edit", "Rewrite the following"),
    ("edit", "Edit this paragraph"),
    ("edit", "Make this email more"),
    ("math", "Solve"),
    ("math", "A store sells"),
    ("math", "If a train"),
    ("math", "What is the probability"),
    ("chat", "What are"),
    ("chat", "Why do"),
    ("chat", "Can you help me"),
    ("chat", "I need advice"),
    ("chat", "Tell me about"),
]


def request_prefix(tokenizer, start: str = "") -> List[int]:
    """Token ids of the chat template up to a user turn's content, then `start`."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
    )
    head = text[: text.index(_SENTINEL)]
    return list(tokenizer.encode(head + start, add_special_tokens=False))


def self_requests(
    target,
    tokenizer,
    n: int,
    *,
    seed: int = 0,
    temperature: float = 0.8,
    max_tokens: int = 160,
    batch_size: int = 256,
    time_budget: Optional[float] = None,
    held_out: Sequence[Prompt] = (),
    stop_tokens: Optional[Sequence[int]] = None,
    min_chars: int = 16,
) -> List[Prompt]:
    """Up to `n` user requests the target writes (sampled at `temperature`),
    as `Prompt`s of kind `self_<category>` in a seeded order.

    A turn counts only if the target ends it (a stop token: the template's
    end of turn, by default the tokenizer's end ids) within `max_tokens`
    and with no special token before it (a template's marks); turns shorter
    than `min_chars`, repeated, or sharing a 10-word run with a `held_out`
    prompt are dropped.
    """
    from .natural import shared_spans

    rng = random.Random(seed)
    picks = [rng.choice(STARTS) for _ in range(n)]
    prefixes = {start: request_prefix(tokenizer, start) for _, start in set(picks)}
    # Rows with the same prefix are sampled apart (each row its own draw).
    rows = [prefixes[start] for _, start in picks]
    stops = sorted(tokenizer.eos_token_ids) if stop_tokens is None else list(stop_tokens)
    data = generate_responses(
        target,
        rows,
        stop_tokens=stops,
        max_tokens=max_tokens,
        batch_size=batch_size,
        time_budget=time_budget,
        min_response=1,
        seed=seed,
        temperature=temperature,
    )
    category = {s: c for c, s in STARTS}
    specials = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    start_of = {tuple(p): s for s, p in prefixes.items()}
    head = tokenizer.decode(request_prefix(tokenizer))
    out, seen = [], set()
    for i in range(len(data)):
        seq = data.sequence(i).tolist()
        plen = int(data.prompt_lens[i])
        turn = seq[plen:]
        if not turn or turn[-1] not in stops or specials & set(turn[:-1]):
            continue  # cut at max_tokens, or running into another turn: not one request
        start = start_of[tuple(seq[:plen])]
        # Decoded with the template before it: a SentencePiece decoder drops
        # the space that starts a piece decoded on its own ("that" + "the").
        whole = tokenizer.decode(seq[:-1])
        turn_text = whole[len(head) :] if whole.startswith(head) else start + tokenizer.decode(turn[:-1])
        text = turn_text.strip()
        if len(text) < min_chars or text in seen:
            continue
        seen.add(text)
        out.append(Prompt(text, f"self_{category[start]}"))
    drop = set(shared_spans(held_out, out)) if held_out else set()
    return [p for j, p in enumerate(out) if j not in drop]
