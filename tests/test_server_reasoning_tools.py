"""Qwen tool calls and reasoning in both APIs, streaming and not.

Scripted targets write each Qwen tool format (XML in `<tool_call>`, a bare
`<function=…>` block, JSON) with its markers cut across tokens, between
reasoning and answer text; a random target checks the reasoning budget
against the target's own continuation after the injected `</think>`.
"""

import asyncio
import json

import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from mlx_lm.tool_parsers import json_tools, qwen3_coder
from helpers import (
    ANSWER,
    CALLS,
    CHAINS,
    MSGS,
    REASONING,
    QWEN_TOOLS_AN,
    QWEN_TOOLS_OA,
    LiveServer,
    ScriptedModel,
    chat_model,
    no_markup,
    qwen_tokenizer,
)

from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.server.common import encode_chat
from mlx_dflash.server.job import Job
from mlx_dflash.server.output import OutputParser, parser_for
from mlx_dflash.server.tools import FUNCTION, tool_syntax
from mlx_dflash.target import Target



def test_tool_syntax_is_picked_from_the_parser(servers):
    xml = tool_syntax(servers["xml"].engine.tokenizer)
    assert xml.bare == (("<function=", "</function>"),)
    assert tool_syntax(servers["json"].engine.tokenizer).bare == ()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fmt", list(CHAINS))
def test_chat_tool_calls(servers, fmt, stream):
    srv = servers[fmt]
    kw = dict(model="tiny", messages=MSGS, tools=QWEN_TOOLS_OA, max_tokens=60)
    if not stream:
        choice = srv.openai.chat.completions.create(**kw).choices[0]
        content, msg = choice.message.content, choice.message
        reasoning = msg.model_extra.get("reasoning_content")
        calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls]
        finish = choice.finish_reason
    else:
        chunks = list(srv.openai.chat.completions.create(**kw, stream=True))
        deltas = [c.choices[0].delta for c in chunks]
        content = "".join(d.content or "" for d in deltas)
        reasoning = "".join(
            d.model_extra.get("reasoning_content") or "" for d in deltas
        )
        streamed = [tc for d in deltas for tc in d.tool_calls or []]
        assert [tc.index for tc in streamed] == list(range(len(streamed)))
        calls = [(c.id, c.function.name, c.function.arguments) for c in streamed]
        finish = chunks[-1].choices[0].finish_reason
    assert finish == "tool_calls"
    assert content == ANSWER and reasoning == REASONING
    no_markup(content)
    assert all(i for i, _, _ in calls)  # ids; and no call without a name
    assert [(n, json.loads(a)) for _, n, a in calls] == CALLS


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fmt", list(CHAINS))
def test_anthropic_tool_use(servers, fmt, stream):
    srv = servers[fmt]
    kw = dict(
        model="claude-x",
        max_tokens=60,
        tools=QWEN_TOOLS_AN,
        messages=MSGS,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    if stream:
        with srv.anthropic.messages.stream(**kw) as s:
            events = list(s)
            m = s.get_final_message()
        deltas = [e.delta for e in events if e.type == "content_block_delta"]
        partial = [d.partial_json for d in deltas if d.type == "input_json_delta"]
        assert [json.loads(p) for p in partial] == [a for _, a in CALLS]
    else:
        m = srv.anthropic.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert m.content[0].thinking == REASONING and m.content[1].text == ANSWER
    no_markup(m.content[1].text)
    assert [(b.name, b.input) for b in m.content[2:]] == CALLS
    assert all(b.id for b in m.content[2:])
    assert m.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_reasoning_not_asked_for_is_dropped(servers, stream):
    srv = servers["xml"]
    kw = dict(model="claude-x", max_tokens=60, tools=QWEN_TOOLS_AN, messages=MSGS)
    if stream:
        with srv.anthropic.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = srv.anthropic.messages.create(**kw)
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"]
    assert m.content[0].text == ANSWER and m.stop_reason == "tool_use"
    # Its tokens were generated, and are counted.
    assert m.usage.output_tokens == len(CHAINS["xml"]) + 1


def test_cut_off_call_is_dropped_not_shown(servers):
    srv = servers["xml"]
    # Cut inside the first call's parameters, then after its </function>.
    for max_tokens, n_calls in ((7, 0), (9, 1)):
        r = srv.openai.chat.completions.create(
            model="tiny", messages=MSGS, tools=QWEN_TOOLS_OA, max_tokens=max_tokens
        )
        choice = r.choices[0]
        assert choice.finish_reason == "length" and choice.message.content == ANSWER
        calls = choice.message.tool_calls or []
        got = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        assert got == CALLS[:n_calls]


def test_without_tools_markup_is_text(servers):
    r = servers["json"].openai.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=60
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and not msg.tool_calls
    assert msg.model_extra["reasoning_content"] == REASONING
    assert '<tool_call>\n{"name": "get_weather"' in msg.content


# ---- the thinking switch ---------------------------------------------------------


def test_enable_thinking_per_request_changes_the_prompt(servers):
    srv = servers["bare"]
    tok = srv.engine.tokenizer

    def ask(**kw):
        return srv.openai.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=3, **kw
        )

    on = tok.decode(encode_chat(srv.engine, [dict(MSGS[0])], None))
    off = tok.decode(
        encode_chat(srv.engine, [dict(MSGS[0])], None, {"enable_thinking": False})
    )
    assert on.endswith("assistant\n<think>\n")
    assert off.endswith("assistant\n<think>\n\n</think>\n\n")
    n_on, n_off = len(tok.encode(on)), len(tok.encode(off))
    for kw, n in [
        ({}, n_on),
        ({"reasoning_effort": "high"}, n_on),
        ({"reasoning_effort": "none"}, n_off),
        ({"reasoning_effort": "minimal"}, n_off),
        ({"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}, n_off),
    ]:
        assert ask(**kw).usage.prompt_tokens == n, kw
    for thinking, n in [
        (None, n_on),
        ({"type": "enabled", "budget_tokens": 1024}, n_on),
        ({"type": "disabled"}, n_off),
    ]:
        extra = {} if thinking is None else {"thinking": thinking}
        count = srv.anthropic.messages.count_tokens(
            model="claude-x", messages=MSGS, **extra
        )
        assert count.input_tokens == n, thinking

    # A prompt that closed the think block: the output is answer, not reasoning
    # (the scripted target writes its "reasoning" anyway; the stray end vanishes).
    msg = ask(reasoning_effort="none").choices[0].message
    assert msg.content == REASONING + "\n\n" + ANSWER
    assert not msg.model_extra.get("reasoning_content")


# ---- the reasoning budget --------------------------------------------------------


def greedy(srv, prompt, n):
    eos = srv.engine.tokenizer.eos_token_ids
    steps = generate_step(
        srv.engine.target,
        prompt,
        PromptLookupDrafter(),
        max_tokens=n,
        block_size=4,
        stop_tokens=eos,
    )
    return [t for t, _ in steps]


def job_tokens(srv, prompt, max_tokens, budget):
    """The tokens the engine emits for one job (EOS excluded)."""

    async def run():
        job = srv.engine.submit(
            Job(prompt=list(prompt), max_tokens=max_tokens, think_budget=budget)
        )
        out = []
        while True:
            ev = await job.next_event()
            out += [ev.token] if ev.token is not None else []
            if ev.finish_reason is not None:
                return out, ev

    return asyncio.run(run())


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])  # trimmable, and not
def test_budget_closes_reasoning_where_the_target_continues(family):
    tok = qwen_tokenizer([], qwen3_coder, opens_think=True)
    target = Target(chat_model(family, len(tok), seed=3))
    srv = LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4))
    try:
        end = tok.convert_tokens_to_ids("</think>")
        prompt = encode_chat(srv.engine, [dict(MSGS[0])], None)
        budget, max_tokens = 6, 24
        free = greedy(srv, prompt, budget + 1)
        assert end not in free and len(free) == budget + 1  # the cap matters here
        want = free[:budget] + [end]
        want += greedy(srv, prompt + want, max_tokens - len(want))
        want = [t for t in want if t not in tok.eos_token_ids]
        got, last = job_tokens(srv, prompt, max_tokens, budget)
        assert got == want
        assert last.usage["completion_tokens"] <= max_tokens

        m = srv.anthropic.messages.create(
            model="claude-x",
            max_tokens=max_tokens,
            messages=MSGS,
            thinking={"type": "enabled", "budget_tokens": budget},
        )
        assert m.content[0].type == "thinking"
        assert m.content[0].thinking == tok.decode(want[:budget])
        # The answer as text: a stray </think> the target writes later is dropped.
        text = tok.decode(want[budget + 1 :]).lstrip().replace("</think>", "")
        assert "".join(b.text for b in m.content[1:]) == text
        # No budget: the reasoning runs on past it.
        got, _ = job_tokens(srv, prompt, max_tokens, None)
        assert got[: budget + 1] == free
    finally:
        srv.close()


def test_budget_counts_from_a_think_the_model_opens():
    words = ["one ", "two "]
    tok = qwen_tokenizer(words, json_tools, opens_think=False)
    ids = {w: tok.convert_tokens_to_ids(w) for w in words + ["\n", "<think>"]}
    end, eos = tok.convert_tokens_to_ids("</think>"), tok.eos_token_id
    ok = tok.convert_tokens_to_ids("O")
    # "\n" -> <think> -> one two one two ... forever; after </think>: "O", then EOS.
    script = {ids["\n"]: ids["<think>"], ids["<think>"]: ids["one "]}
    script.update({ids["one "]: ids["two "], ids["two "]: ids["one "]})
    script.update({end: ok, ok: eos})
    target = Target(ScriptedModel(len(tok), script, default=eos))
    srv = LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4))
    try:
        m = srv.anthropic.messages.create(
            model="claude-x",
            max_tokens=40,
            messages=MSGS,
            thinking={"type": "enabled", "budget_tokens": 3},
        )
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "one two one "
        assert m.content[1].text == "O" and m.stop_reason == "end_turn"
        # <think>, 3 reasoning tokens, </think>, O, EOS
        assert m.usage.output_tokens == 7
        with srv.anthropic.messages.stream(
            model="claude-x",
            max_tokens=40,
            messages=MSGS,
            thinking={"type": "enabled", "budget_tokens": 3},
        ) as s:
            final = s.get_final_message()
        assert [b.model_dump() for b in final.content] == [
            b.model_dump() for b in m.content
        ]
    finally:
        srv.close()


# ---- the parser alone -------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(CHAINS))
def test_parser_is_the_same_fed_one_character_at_a_time(servers, fmt):
    srv = servers[fmt]
    tok = srv.engine.tokenizer
    prompt = encode_chat(srv.engine, [dict(MSGS[0])], QWEN_TOOLS_OA)
    text = "".join(CHAINS[fmt])
    results = []
    for size in (len(text), 1):
        p = parser_for(tok, prompt, [], tools=True)
        segs = []
        for i in range(0, len(text), size):
            segs += p.feed(text[i : i + size])
        segs += p.feed("", final=True)
        joined = {}
        for kind, t in segs:
            joined[kind] = joined.get(kind, "") + t
        results.append((joined, p.tool_calls))
    assert results[0] == results[1]
    assert results[0][0] == {"reasoning": REASONING, "normal": ANSWER}


def test_tool_markup_in_reasoning_stays_reasoning():
    p = OutputParser(
        think=("<think>", "</think>"),
        tool=("<tool_call>", "</tool_call>"),
        bare=[FUNCTION],
    )
    draft = "maybe <tool_call><function=x></function></tool_call> then"
    segs = p.feed(f"<think>{draft}</think>\n\nHi <function=y></function> there", True)
    assert segs == [("reasoning", draft), ("normal", "Hi  there")]
    assert p.tool_calls == ["<function=y></function>"]  # drafts are not run
