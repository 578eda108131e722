"""Natural prompts, long agent transcripts, length-capped batches, sampled
generation, chunked prefill and the eval suites (tiny random models, CPU)."""

import json
from collections import Counter

import mlx.core as mx
import numpy as np
import pytest
from helpers import chat_model, make_tokenizer
from models import VOCAB, tiny_model

from mlx_dflash.target import Target
from mlx_dflash.train import agent_context
from mlx_dflash.train.data import Dataset, generate_responses, greedy_batch
from mlx_dflash.train.evaluate import (
    HELD_OUT_NATURAL,
    natural_held_out,
    run_suite,
)
from mlx_dflash.train.natural import DEFAULT_MIX, natural_prompts, shared_spans
from mlx_dflash.train.prompts import Prompt, encode_messages
from mlx_dflash.train.trainer import TrainArgs, batch_rows, init_draft, shuffled


def test_natural_pieces_1_compose_what_stages_3_to_5_were_trained_on():
    # The recipe stays reproducible: version 1's draws are unchanged by
    # the pieces that version 2 adds.
    import hashlib

    def digest(ps):
        return hashlib.sha256(json.dumps([p.messages for p in ps]).encode()).hexdigest()[:16]

    assert digest(natural_prompts(2000, seed=0)) == "596e0471c29abdea"
    # Version 2's (stage 6's) too, unchanged by version 3's pieces.
    assert digest(natural_prompts(2000, seed=0, pieces=2)) == "82581be2819a715f"
    # Version 3's (stage 7's) too, unchanged by version 4's free-form requests.
    assert digest(natural_prompts(2000, seed=0, pieces=3)) == "49638e7333c02aaf"
    # Version 4's (stage 9's) too, unchanged by version 5's second free-form set.
    assert digest(natural_prompts(2000, seed=0, pieces=4)) == "84f3e1d071142ff2"
    # Version 5's (stages 10-11's) too, unchanged by version 6's third set.
    assert digest(natural_prompts(2000, seed=0, pieces=5)) == "47123a477b737603"
    with pytest.raises(ValueError, match="pieces 7"):
        natural_prompts(10, pieces=7)


def test_natural_pieces_2_and_3_are_wider_and_disjoint_from_held_out():
    one, two = natural_prompts(3000, seed=0), natural_prompts(3000, seed=0, pieces=2)
    three = natural_prompts(3000, seed=0, pieces=3)
    assert set(Counter(p.kind for p in two)) == set(DEFAULT_MIX) and len(two) == 3000
    assert len({p.text for p in two} - {p.text for p in one}) > 1000
    # Version 3 draws other math and chat: sequences, systems, quadratics...
    maths = {p.text for p in three if p.kind == "math"} - {p.text for p in two}
    assert len(maths) > 100 and any("sequence" in t for t in maths)
    assert {p.text for p in three if p.kind == "chat"} - {p.text for p in two}
    # Conceptual and one-line code_explain requests (no pasted block).
    assert any(p.kind == "code_explain" and "```" not in p.text for p in two)
    held = natural_held_out()
    for composed in (two, three):
        assert not {p.text for p in held} & {p.text for p in composed}
        assert shared_spans(composed, held, n=10) == []
    # No piece (a question, a task, a snippet...) is a held-out prompt or inside one.
    import mlx_dflash.train.natural as natural

    texts = [h.text.lower() for h in held]

    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, (list, tuple)):
            for y in x:
                yield from strings(y)

    for name in dir(natural):
        if name.isupper():
            for x in strings(getattr(natural, name)):
                assert len(x) <= 15 or not any(x.lower() in t for t in texts), (name, x)


def _check_free_set(path, last_roles):
    """A free-form request file: every category with >= 80 requests, none twice,
    each opened by the user, ended by one of `last_roles`, no empty message."""
    from mlx_dflash.train.natural import free_form

    items = json.loads(path.read_text())
    free = free_form((path.name,))
    assert set(free) == set(DEFAULT_MIX) and min(len(v) for v in free.values()) >= 80
    assert len({json.dumps(i["messages"]) for i in items}) == len(items)
    for item in items:
        roles = [m["role"] for m in item["messages"]]
        assert roles[0] == "user" and roles[-1] in last_roles, item
        assert all(m["content"].strip() for m in item["messages"])
    return items, free


def test_natural_pieces_4_draw_free_form_requests_apart_from_held_out():
    from mlx_dflash.train.natural import FREE_FORM

    _, free = _check_free_set(FREE_FORM, ("user", "tool"))
    four = natural_prompts(3000, seed=0, pieces=4)
    three = natural_prompts(3000, seed=0, pieces=3)
    assert set(Counter(p.kind for p in four)) == set(DEFAULT_MIX) and len(four) == 3000
    # About a third of them are free-form (framed: a greeting or thanks around them).
    cores = {m[0]["content"] for v in free.values() for _, m in v}
    drawn = [p for p in four if any(c in p.messages[-1]["content"] or c in p.messages[0]["content"]
                                    or (len(p.messages) > 1 and c in p.messages[1]["content"])
                                    for c in cores)]
    assert 0.25 * len(four) < len(drawn) < 0.45 * len(four)
    # Free tool_use turns come after a system prompt with tools.
    tools = [p for p in drawn if p.kind == "tool_use"]
    assert tools and all(p.messages[0]["role"] == "system" and "# Tools" in p.messages[0]["content"]
                         for p in tools)
    assert {p.text for p in four} - {p.text for p in three}
    held = natural_held_out()
    assert not {p.text for p in held} & {p.text for p in four}
    # No free-form request shares a run of 10 words with a held-out prompt.
    as_prompts = [Prompt(m[-1]["content"], c, m) for c, v in free.items() for _, m in v]
    assert shared_spans(as_prompts, held, n=10) == []


def _check_added_set(pieces, path, earlier, share, new_share):
    """Version `pieces` adds free-form set `path` to the `earlier` ones: no request
    repeats an earlier one, each names a harness kind if and only if it is a
    tool_use request; of the version's prompts a share strictly inside `share`
    (low, high) is drawn from all the sets, more than `new_share` of those from
    the added one; no prompt is a held-out one, and no request of the added set
    shares a run of 10 words with a held-out prompt."""
    from mlx_dflash.train.natural import free_form

    items, added = _check_free_set(path, ("user",))
    for item in items:  # tool_use requests name the harness they go to; no other does
        assert (item["kind"] in ("coding", "general")) == (item["category"] == "tool_use"), item
    seen = {json.dumps(i["messages"]) for f in earlier for i in json.loads(f.read_text())}
    assert not seen & {json.dumps(i["messages"]) for i in items}
    drawn_from = natural_prompts(3000, seed=0, pieces=pieces)
    assert set(Counter(p.kind for p in drawn_from)) == set(DEFAULT_MIX) and len(drawn_from) == 3000
    every = free_form(tuple(f.name for f in earlier) + (path.name,))
    cores = {m[0]["content"] for v in every.values() for _, m in v}
    drawn = [p for p in drawn_from if any(c in m["content"] for c in cores for m in p.messages[:2])]
    assert share[0] * len(drawn_from) < len(drawn) < share[1] * len(drawn_from)
    new = {m[0]["content"] for v in added.values() for _, m in v}
    assert sum(any(c in m["content"] for c in new for m in p.messages[:2]) for p in drawn) > new_share * len(drawn)
    held = natural_held_out()
    assert not {p.text for p in held} & {p.text for p in drawn_from}
    as_prompts = [Prompt(m[-1]["content"], c, m) for c, v in added.items() for _, m in v]
    assert shared_spans(as_prompts, held, n=10) == []


def test_natural_pieces_5_draw_a_second_free_form_set_apart_from_held_out():
    from mlx_dflash.train.natural import FREE_FORM, FREE_FORM_2

    _check_added_set(5, FREE_FORM_2, (FREE_FORM,), share=(0.5, 0.7), new_share=0)


def test_natural_pieces_6_draw_a_third_free_form_set_apart_from_held_out():
    from mlx_dflash.train.natural import FREE_FORM, FREE_FORM_2, FREE_FORM_3

    _check_added_set(6, FREE_FORM_3, (FREE_FORM, FREE_FORM_2), share=(0.6, 0.8), new_share=0.2)


def test_held_out_natural_covers_every_category():
    items = json.loads(HELD_OUT_NATURAL.read_text())
    counts = Counter(h["category"] for h in items)
    assert set(counts) == set(DEFAULT_MIX) and min(counts.values()) >= 10
    assert all(h["messages"][-1]["role"] in ("user", "tool") for h in items)


def test_natural_prompts_are_seeded_mixed_and_disjoint_from_held_out():
    a = natural_prompts(3000, seed=0)
    assert [p.messages for p in a] == [p.messages for p in natural_prompts(3000, seed=0)]
    kinds = Counter(p.kind for p in a)
    assert set(kinds) == set(DEFAULT_MIX) and len(a) == 3000
    held = natural_held_out()
    assert not {p.text for p in held} & {p.text for p in a}
    # No held-out prompt shares a run of 10 words with a training prompt.
    assert shared_spans(a, held, n=10) == []
    assert shared_spans(a, a[:5], n=10) == [0, 1, 2, 3, 4]


def test_transcripts_hit_their_length_and_keep_splits_apart():
    tok = make_tokenizer(words=[chr(c) for c in range(97, 123)])
    train, ev = agent_context.stdlib_files("train"), agent_context.stdlib_files("eval")
    assert train and ev and not set(train) & set(ev)
    for n in (2500, 6000):  # characters: a char-level tokenizer
        m = agent_context.transcript(tok, n, 3, split="eval")
        L = len(encode_messages(tok, m))
        assert 0.6 * n <= L <= n
        shown = [x["content"] for x in m if x["role"] == "user"][:-1]
        assert all(any(f in s for f in ev) for s in shown)
        assert m == agent_context.transcript(tok, n, 3, split="eval")  # seeded
    assert m[0]["role"] == "system" and m[-1]["role"] == "user"


def test_line_token_counts_belong_to_their_tokenizer_object():
    # Counts cached per tokenizer object (not its id(), which the next tokenizer made at
    # that address would inherit), and dropped with it.
    import gc

    rel = agent_context.stdlib_files("eval")[0]
    chars, words = make_tokenizer(), make_tokenizer(words=["def ", "return", "self", "    "])
    a, b = agent_context._line_tokens(chars, rel), agent_context._line_tokens(words, rel)
    lines = agent_context._read(rel).split("\n")
    assert a[-1] == sum(len(line) + 1 for line in lines) and b[-1] < a[-1]
    assert agent_context._line_tokens(words, rel) is b  # once per file and tokenizer
    held = len(agent_context._LINE_TOKENS)
    del chars
    gc.collect()
    assert len(agent_context._LINE_TOKENS) == held - 1 and words in agent_context._LINE_TOKENS


def _prompts(n, lo, hi, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB - 1, k).tolist() for k in rng.integers(lo, hi, n)]


def test_chunked_prefill_and_token_capped_batches_equal_plain_greedy():
    from mlx_lm.generate import generate_step

    target = Target(tiny_model("llama"))
    prompts = _prompts(5, 20, 90)
    ref = [
        [int(t) for t, _ in generate_step(mx.array(p), target.model, max_tokens=12)]
        for p in prompts
    ]
    got = greedy_batch(target, prompts, stop_tokens=[], max_tokens=12, prefill_chunk=32, min_rows=2)
    assert got == ref
    data = generate_responses(
        target, prompts, stop_tokens=[], max_tokens=12, batch_size=8,
        max_batch_tokens=3 * 110, min_response=0,
    )
    out = {tuple(data.sequence(i)[: data.prompt_lens[i]].tolist()): data.sequence(i)[data.prompt_lens[i]:].tolist() for i in range(len(data))}
    assert [out[tuple(p)] for p in prompts] == ref


def test_sampled_generation_is_seeded_and_differs_from_greedy():
    target = Target(tiny_model("llama"))
    prompts = _prompts(4, 5, 15)
    kw = dict(stop_tokens=[], max_tokens=16, min_response=0)
    a = generate_responses(target, prompts, temperature=1.0, seed=1, **kw)
    b = generate_responses(target, prompts, temperature=1.0, seed=1, **kw)
    g = generate_responses(target, prompts, **kw)
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, g.tokens)


def test_length_capped_training_batches():
    seqs = [[1] * n for n in [40, 500, 60, 900, 70, 30, 800, 50]]
    data = Dataset.from_lists(seqs, [4] * len(seqs))
    args = TrainArgs(batch_size=4, batch_tokens=2048, max_len=1024)
    order = shuffled(data, args, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(8))
    lens = np.diff(data.offsets)[order]
    # One window: the 4 shortest and the 4 longest form the batches (in either order).
    assert sorted(lens[:4].tolist()) in ([30, 40, 50, 60], [70, 500, 800, 900])
    short = order[np.argsort(lens)][:4]
    long = order[np.argsort(lens)][4:]  # 70, 500, 800, 900: padded 128, 512, 832, 960
    assert batch_rows(data, long, args) == 2  # 3 rows x 832 would pass 2048
    assert batch_rows(data, short, args) == 4  # short ones: a full batch
    assert batch_rows(data, order[:4], TrainArgs(batch_size=4)) == 4


def test_eval_suites_report_tau_per_category_and_stay_lossless():
    from mlx_dflash.train.prompts import Prompt

    tok = make_tokenizer(words=[chr(c) for c in range(97, 123)])
    target = Target(chat_model("llama", len(tok._tokenizer.get_vocab())))
    draft = init_draft(target, num_layers=1, mask_token_id=3, block_size=16, seed=1)
    prompts = [
        Prompt("a b c", "chat", [{"role": "user", "content": "a b c"}]),
        Prompt("d e", "math", [{"role": "user", "content": "d e"}]),
    ]
    g = run_suite(target, draft, tok, prompts, max_tokens=10)
    assert g["identical_to_greedy"] and set(g["per_category"]) == {"chat", "math"}
    assert 1 <= g["tau"] <= 16 and g["per_category"]["chat"]["prompts"] == 1
    s = run_suite(target, draft, tok, prompts, max_tokens=10, temperature=1.0, seed=2)
    assert "identical_to_greedy" not in s and s["cycles"] > 0


def test_evaluate_runs_every_suite_in_order_and_skips_past_its_budget():
    from types import SimpleNamespace

    from mlx_dflash.train.evaluate import evaluate

    tok = make_tokenizer(words=[chr(c) for c in range(97, 123)])
    target = Target(chat_model("llama", len(tok._tokenizer.get_vocab())))
    draft = init_draft(target, num_layers=1, mask_token_id=3, block_size=16, seed=1)
    a = SimpleNamespace(
        eval_sets={"natural", "long", "old"}, eval_natural=1, eval_contexts="1500",
        eval_context_prompts=1, eval_temperatures="0.7,1.0", eval_sampled_natural=1,
        eval_sampled_context=1, eval_seed=0, eval_prompts=1, eval_max_tokens=4,
        eval_time_budget=None, seed=0,
    )
    seen = []  # what a process cut after each suite would have written
    r = evaluate(target, draft, tok, a, on_suite=lambda p: seen.append(json.loads(json.dumps(p))))
    assert set(r["natural"]) == {"greedy", "T1.0", "T0.7"} and r["skipped"] == []
    assert len(seen) == 7 and list(seen[0]["natural"]) == ["greedy"] and "long_1500" not in seen[0]
    assert seen[-1]["old"] == r["old"] and seen[1]["long_1500"]["greedy"] == r["long_1500"]["greedy"]
    assert set(r["natural"]["greedy"]["per_category"]) == set(DEFAULT_MIX)
    # Every suite's greedy output is mlx_lm's own (this once failed in ~half the full-suite
    # runs: the test tokenizer gave ids past the model's embedding table, read as garbage).
    assert r["natural"]["greedy"]["identical_to_greedy"], r["natural"]["greedy"]
    assert r["long_1500"]["greedy"]["identical_to_greedy"] and "T1.0" in r["long_1500"]
    assert r["old"]["greedy"]["prompts"] == 1
    a.eval_time_budget, a.eval_sets = 0.0, {"natural", "old"}
    r = evaluate(target, draft, tok, a)  # the first suite always runs
    assert "greedy" in r["natural"] and r["skipped"] == ["natural/T1.0", "natural/T0.7", "old/greedy"]


def test_request_prefix_is_the_template_up_to_a_user_turn():
    from mlx_dflash.train.self_requests import request_prefix

    tok = make_tokenizer()
    head = request_prefix(tok)
    whole = encode_messages(tok, [{"role": "user", "content": "Solve 2x = 4"}])
    assert whole[: len(head)] == head and len(head) < len(whole)
    assert tok.decode(request_prefix(tok, "Solve")[len(head):]) == "Solve"


def test_self_requests_keep_whole_distinct_turns_seeded_and_apart_from_held_out():
    from mlx_dflash.train.self_requests import STARTS, self_requests

    tok = make_tokenizer()
    target = Target(chat_model("llama", len(tok)))
    # The random model rarely writes the end of turn: stopping on any letter
    # ends turns within a few tokens, so what is kept can be checked.
    stops = [tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
    kw = dict(seed=5, max_tokens=24, stop_tokens=stops, min_chars=1)
    got = self_requests(target, tok, 40, **kw)
    assert got == self_requests(target, tok, 40, **kw)
    assert 0 < len(got) <= 40 and len({p.text for p in got}) == len(got)
    starts = {f"self_{c}": [] for c, _ in STARTS}
    for c, s in STARTS:
        starts[f"self_{c}"].append(s.strip())
    for p in got:
        start = max((s for s in starts[p.kind] if p.text.startswith(s)), key=len, default=None)
        assert start is not None
        # The turn ends at its first stop token, which is not part of the text.
        assert not set(p.text[len(start):]) & set("abcdefghijklmnopqrstuvwxyz")
    # Turns cut at max_tokens are dropped; so are those sharing 10 words with held-out ones.
    assert self_requests(target, tok, 40, **{**kw, "stop_tokens": []}) == []
    held = [Prompt(p.text, "chat") for p in got]
    assert self_requests(target, tok, 40, held_out=held, **kw) == [
        p for p in got if len(p.text.split()) < 10
    ]


def test_self_requests_keep_the_space_a_sentencepiece_decoder_drops():
    from mlx_dflash.train.self_requests import STARTS, self_requests

    class LeadingSpaceDropped:
        """A SentencePiece-like decode: the space starting the first piece is dropped."""

        def __init__(self, tok):
            self._tok = tok

        def __getattr__(self, name):
            return getattr(self._tok, name)

        def decode(self, ids):
            return self._tok.decode(ids).lstrip(" ")

    tok = make_tokenizer()
    target = Target(chat_model("llama", len(tok)))
    stops = [tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
    # Seed 19 draws a turn that goes on from its opening words with a space.
    kw = dict(seed=19, max_tokens=24, stop_tokens=stops, min_chars=1)
    got = self_requests(target, tok, 40, **kw)
    assert any(p.text.startswith(s + " ") for p in got for _, s in STARTS if s)
    assert self_requests(target, LeadingSpaceDropped(tok), 40, **kw) == got

