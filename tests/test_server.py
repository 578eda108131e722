"""The HTTP server on loopback, driven by the official openai and anthropic SDKs.

Tiny random fp32 models with a character-level chat tokenizer; a scripted
"bigram" target makes reasoning and tool calls happen on cue.
"""

import json
import time

import httpx
import mlx.core as mx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
anthropic = pytest.importorskip("anthropic")  # the SDKs, as absent there
openai = pytest.importorskip("openai")  # the SDKs, as absent there
from helpers import (
    MESSAGES,
    TOOLS_AN,
    TOOLS_OA,
    LiveServer,
    chat_prompt,
    expected,
    random_provider,
)

# ---- OpenAI ----------------------------------------------------------------------


def test_chat_matches_generate(srv):
    tokens, text = expected(srv, chat_prompt(srv, MESSAGES), 20)
    raw = srv.openai.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=20
    )
    r = raw.parse()
    assert raw.headers["x-mlx-dflash-engine"] == "speculative-greedy"
    assert raw.headers["x-mlx-dflash-drafter"] == "lookup"
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == ("length" if len(tokens) == 20 else "stop")
    assert r.usage.completion_tokens == len(tokens)
    assert r.usage.prompt_tokens == len(chat_prompt(srv, MESSAGES))
    assert r.model_extra["mlx_dflash"]["engine"] == "speculative-greedy"

    chunks = list(
        srv.openai.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
        tokens
    )
    # The second identical request reused the prompt cache.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0


def test_completions_match_generate(srv):
    prompt = "one two three one two three"
    tokens, text = expected(srv, srv.engine.tokenizer.encode(prompt), 16)
    r = srv.openai.completions.create(model="tiny", prompt=prompt, max_tokens=16)
    assert r.choices[0].text == text
    assert r.usage.completion_tokens == len(tokens)
    chunks = list(
        srv.openai.completions.create(
            model="tiny", prompt=prompt, max_tokens=16, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_stop_sequence(srv):
    _, text = expected(srv, chat_prompt(srv, MESSAGES), 20)
    stop = text[3:5]
    cut = text[: text.index(stop)]
    r = srv.openai.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=20, stop=[stop]
    )
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    m = srv.anthropic.messages.create(
        model="claude-local",
        max_tokens=20,
        system=MESSAGES[0]["content"],
        messages=MESSAGES[1:],
        stop_sequences=[stop],
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert "".join(b.text for b in m.content) == cut


def test_sampling_says_which_engine_served_it(srv):
    want = srv.engine.engine_name(0.7)
    assert want == "speculative-sampling"
    raw = srv.openai.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.7, seed=1
    )
    assert raw.headers["x-mlx-dflash-engine"] == want
    assert raw.parse().model_extra["mlx_dflash"]["engine"] == want
    m = srv.anthropic.messages.with_raw_response.create(
        model="claude-x",
        max_tokens=8,
        messages=MESSAGES[1:],
        extra_body={"temperature": 0.5},
    )
    assert m.headers["x-mlx-dflash-engine"] == want


def test_default_temperature_follows_each_api(srv):
    """No temperature: the API's documented 1.0, unless --default-temperature."""
    srv.engine.config.default_temperature = None
    try:
        raw = srv.openai.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=4
        )
        assert raw.headers["x-mlx-dflash-engine"] == "speculative-sampling"
        raw = srv.anthropic.messages.with_raw_response.create(
            model="claude-x", max_tokens=4, messages=MESSAGES[1:]
        )
        assert raw.headers["x-mlx-dflash-engine"] == "speculative-sampling"
        raw = srv.openai.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=4, temperature=0
        )
        assert raw.headers["x-mlx-dflash-engine"] == "speculative-greedy"
    finally:
        srv.engine.config.default_temperature = 0.0
    raw = srv.anthropic.messages.with_raw_response.create(
        model="claude-x", max_tokens=4, messages=MESSAGES[1:]
    )
    assert raw.headers["x-mlx-dflash-engine"] == "speculative-greedy"


def target_logprobs(srv, prompt, tokens):
    """log-softmax of the target's logits at each emitted token (direct model call)."""
    model = srv.engine.target.model
    logits = model(mx.array([list(prompt) + list(tokens[:-1])]))[0, len(prompt) - 1 :]
    return (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).astype(mx.float32)


def check_chat_logprobs(srv, content, prompt, tokens, top):
    tok = srv.engine.tokenizer
    body = [t for t in tokens if t not in tok.eos_token_ids]
    assert len(content) == len(body)
    ref = target_logprobs(srv, prompt, tokens)
    for i, (entry, t) in enumerate(zip(content, body)):
        assert entry.token == tok.decode([t])
        assert bytes(entry.bytes) == tok.decode([t]).encode()
        assert abs(entry.logprob - ref[i, t].item()) < 1e-4
        assert len(entry.top_logprobs) == top
        want = mx.argsort(-ref[i])[:top].tolist()
        assert [e.token for e in entry.top_logprobs] == [tok.decode([j]) for j in want]
        for e, j in zip(entry.top_logprobs, want):
            assert abs(e.logprob - ref[i, j].item()) < 1e-4


def test_chat_logprobs_are_the_targets(srv):
    prompt = chat_prompt(srv, MESSAGES)
    tokens, text = expected(srv, prompt, 12)
    kw = dict(model="tiny", messages=MESSAGES, max_tokens=12, logprobs=True)
    r = srv.openai.chat.completions.create(**kw, top_logprobs=3)
    assert r.choices[0].message.content == text
    check_chat_logprobs(srv, r.choices[0].logprobs.content, prompt, tokens, 3)

    chunks = list(srv.openai.chat.completions.create(**kw, top_logprobs=3, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [e.model_dump() for e in streamed] == [
        e.model_dump() for e in r.choices[0].logprobs.content
    ]

    # Sampling: still the target's own log-probabilities (before temperature).
    r = srv.openai.chat.completions.create(**kw, temperature=0.9, seed=7)
    tok = srv.engine.tokenizer
    ids = [tok.convert_tokens_to_ids(e.token) for e in r.choices[0].logprobs.content]
    ref = target_logprobs(srv, prompt, ids + [0])
    for i, (e, t) in enumerate(zip(r.choices[0].logprobs.content, ids)):
        assert abs(e.logprob - ref[i, t].item()) < 1e-4 and e.top_logprobs == []
    again = srv.openai.chat.completions.create(**kw, temperature=0.9, seed=7)
    assert again.choices[0].message.content == r.choices[0].message.content

    with pytest.raises(openai.BadRequestError):
        srv.openai.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=2, top_logprobs=2
        )


def test_completion_logprobs(srv):
    prompt = "one two three one two three"
    ids = srv.engine.tokenizer.encode(prompt)
    tokens, text = expected(srv, ids, 10)
    body = [t for t in tokens if t not in srv.engine.tokenizer.eos_token_ids]
    ref = target_logprobs(srv, ids, tokens)
    r = srv.openai.completions.create(
        model="tiny", prompt=prompt, max_tokens=10, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text == text
    assert len(lp.token_logprobs) == len(body)
    for i, t in enumerate(body):
        assert abs(lp.token_logprobs[i] - ref[i, t].item()) < 1e-4
        assert len(lp.top_logprobs[i]) == 2
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(body))]
    chunks = list(
        srv.openai.completions.create(
            model="tiny", prompt=prompt, max_tokens=10, logprobs=2, stream=True
        )
    )
    streamed = [x for c in chunks for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    offsets = [x for c in chunks for x in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_models_health_metrics(srv):
    models = srv.openai.models.list().data
    assert models[0].id == "tiny"
    assert models[0].model_extra["mlx_dflash"]["drafter"] == "lookup"
    assert srv.anthropic.models.list().data[0].id == "tiny"
    assert httpx.get(srv.url + "/health").json() == {"status": "ok"}
    srv.openai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    text = httpx.get(srv.url + "/metrics").text
    for name in (
        "mlx_dflash_generation_tokens_total",
        "mlx_dflash_queue_depth",
        "mlx_dflash_last_tau",
        "mlx_dflash_prompt_cache_hits_total",
        "mlx_dflash_accepted_tokens_total",
        "mlx_dflash_mlx_active_memory_bytes",
    ):
        assert name in text


# ---- Anthropic -------------------------------------------------------------------


def test_messages_match_generate(srv):
    tokens, text = expected(srv, chat_prompt(srv, MESSAGES), 20)
    kwargs = dict(
        model="claude-local",
        max_tokens=20,
        system=[{"type": "text", "text": MESSAGES[0]["content"]}],
        messages=[{"role": "user", "content": MESSAGES[1]["content"]}],
    )
    m = srv.anthropic.messages.create(**kwargs)
    assert m.content[0].type == "text" and m.content[0].text == text
    assert m.stop_reason == ("max_tokens" if len(tokens) == 20 else "end_turn")
    assert m.usage.output_tokens == len(tokens)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == len(
        chat_prompt(srv, MESSAGES)
    )

    with srv.anthropic.messages.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and "content_block_start" in kinds
    assert final.content[0].text == text and final.stop_reason == m.stop_reason

    n = srv.anthropic.messages.count_tokens(
        model="claude-local", system=MESSAGES[0]["content"], messages=MESSAGES[1:]
    )
    assert n.input_tokens == len(chat_prompt(srv, MESSAGES))


def test_billing_header_is_normalised(srv):
    def ask(nonce):
        system = [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.1"
                f".{nonce}; cc_entrypoint=cli; cch={nonce}ab;",
            },
            {"type": "text", "text": "You are terse."},
        ]
        return srv.anthropic.messages.count_tokens(
            model="claude-x", system=system, messages=MESSAGES[1:]
        ).input_tokens

    assert ask("abc") == ask("f01")


# ---- bad input --------------------------------------------------------------------


def _post(srv, path, body, **kw):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(
        srv.url + path, content=data, headers={"content-type": "application/json"}, **kw
    )


def test_bad_inputs_get_4xx_in_each_api_format(srv):
    good_oa = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4}
    good_an = {"model": "claude-3", "max_tokens": 4, "messages": MESSAGES[1:]}
    long_text = "x " * 5000
    cases = [
        ("/v1/chat/completions", "{not json", 400),
        ("/v1/chat/completions", {**good_oa, "messages": "hi"}, 400),
        ("/v1/chat/completions", {**good_oa, "bogus": 1}, 200),  # ignored
        ("/v1/chat/completions", {**good_oa, "messages": []}, 400),
        ("/v1/chat/completions", {**good_oa, "max_tokens": 0}, 400),
        ("/v1/chat/completions", {**good_oa, "model": "gpt-nope"}, 404),
        ("/v1/chat/completions", {**good_oa, "n": 2}, 400),
        (
            "/v1/chat/completions",
            {**good_oa, "messages": [{"role": "user", "content": long_text}]},
            400,
        ),
        ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": -1}, 400),
        ("/v1/messages", "{not json", 400),
        ("/v1/messages", {**good_an, "max_tokens": 0}, 400),
        ("/v1/messages", {k: v for k, v in good_an.items() if k != "max_tokens"}, 400),
        ("/v1/messages", {**good_an, "messages": []}, 400),
        ("/v1/messages", {**good_an, "bogus": True}, 200),  # ignored
        ("/v1/messages", {**good_an, "model": "gpt-nope"}, 404),
        (
            "/v1/messages",
            {**good_an, "messages": [{"role": "robot", "content": "x"}]},
            400,
        ),
        (
            "/v1/messages",
            {**good_an, "messages": [{"role": "user", "content": long_text}]},
            400,
        ),
    ]
    for path, body, status in cases:
        r = _post(srv, path, body)
        assert r.status_code == status, (
            path,
            body if len(str(body)) < 200 else "...",
            r.text,
        )
        err = r.json()
        if status == 200:
            continue
        if path.startswith("/v1/messages"):
            assert err["type"] == "error" and err["error"]["message"]
            assert err["error"]["type"] in ("invalid_request_error", "not_found_error")
        else:
            assert set(err["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.BadRequestError):
        srv.openai.chat.completions.create(model="tiny", messages=[], max_tokens=4)
    with pytest.raises(anthropic.BadRequestError):
        srv.anthropic.messages.create(
            model="claude-x", max_tokens=0, messages=MESSAGES[1:]
        )
    # ... and the server keeps serving.
    assert (
        srv.openai.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4
        )
        .choices[0]
        .finish_reason
    )


def test_client_disconnect_cancels(srv):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # closes the connection mid-stream
    deadline = time.time() + 20
    while "cancelled" not in httpx.get(srv.url + "/metrics").text:
        assert time.time() < deadline, "generation was not cancelled"
        time.sleep(0.1)
    assert (
        srv.openai.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4
        )
        .choices[0]
        .finish_reason
    )


def test_api_key():
    s = LiveServer(random_provider(), api_key="sekret")
    try:
        assert httpx.get(s.url + "/health").status_code == 200
        r = httpx.get(s.url + "/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = _post(
            s,
            "/v1/messages",
            {"model": "claude-x", "max_tokens": 2, "messages": MESSAGES[1:]},
        )
        assert (
            r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        )
        assert s.openai.models.list().data[0].id == "tiny"
        assert (
            s.anthropic.messages.create(
                model="claude-x", max_tokens=2, messages=MESSAGES[1:]
            ).content
            is not None
        )
    finally:
        s.close()


# ---- tool calls (scripted target, helpers.tool_provider) -------------------------


def test_tool_calls_openai(tool_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = tool_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS_OA, max_tokens=30
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.model_extra["reasoning_content"] == "hmm, weather"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    chunks = list(
        tool_srv.openai.chat.completions.create(
            model="tiny", messages=msgs, tools=TOOLS_OA, max_tokens=30, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The tool result goes back in; the template renders the call and the result.
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    msgs[1].pop("reasoning_content", None)
    r2 = tool_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS_OA, max_tokens=30
    )
    assert r2.choices[0].finish_reason == "tool_calls"


def test_tool_calls_anthropic(tool_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    # Thinking blocks come back when the request enables thinking.
    think = {"type": "enabled", "budget_tokens": 1024}
    m = tool_srv.anthropic.messages.create(
        model="claude-local",
        max_tokens=30,
        tools=TOOLS_AN,
        messages=msgs,
        thinking=think,
    )
    assert [b.type for b in m.content] == ["thinking", "text", "tool_use"]
    assert m.content[0].thinking == "hmm, weather"
    assert m.content[1].text == "Let me check."
    assert m.content[2].name == "get_weather" and m.content[2].input == {
        "city": "Paris"
    }
    assert m.stop_reason == "tool_use"

    with tool_srv.anthropic.messages.stream(
        model="claude-local",
        max_tokens=30,
        tools=TOOLS_AN,
        messages=msgs,
        thinking=think,
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"

    msgs += [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": m.content[2].id,
                    "content": "sunny",
                }
            ],
        },
    ]
    m2 = tool_srv.anthropic.messages.create(
        model="claude-local", max_tokens=30, tools=TOOLS_AN, messages=msgs
    )
    assert m2.stop_reason == "tool_use"


def test_tool_choice(tool_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    no_tools = len(chat_prompt(tool_srv, msgs))
    # "none": the tools are not shown to the model at all.
    r = tool_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS_OA, tool_choice="none", max_tokens=30
    )
    assert r.usage.prompt_tokens == no_tools and not r.choices[0].message.tool_calls
    m = tool_srv.anthropic.messages.create(
        model="claude-x",
        max_tokens=30,
        tools=TOOLS_AN,
        tool_choice={"type": "none"},
        messages=msgs,
    )
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == no_tools
    assert all(b.type != "tool_use" for b in m.content)
    # "auto" (and parallel calls off) calls the tool.
    r = tool_srv.openai.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=TOOLS_OA,
        tool_choice="auto",
        parallel_tool_calls=False,
        max_tokens=30,
    )
    assert len(r.choices[0].message.tool_calls) == 1
    m = tool_srv.anthropic.messages.create(
        model="claude-x",
        max_tokens=30,
        tools=TOOLS_AN,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=msgs,
    )
    assert [b.type for b in m.content][-1] == "tool_use"
    # Forced calls would need constrained decoding: refused, never ignored.
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        tool_srv.openai.chat.completions.create(
            model="tiny",
            messages=msgs,
            tools=TOOLS_OA,
            tool_choice="required",
            max_tokens=30,
        )
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        tool_srv.anthropic.messages.create(
            model="claude-x",
            max_tokens=30,
            tools=TOOLS_AN,
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=msgs,
        )


def test_output_parser_handles_markers_split_across_pieces():
    from mlx_dflash.server.output import OutputParser

    p = OutputParser(
        think=("<think>", "</think>"),
        tool=("<tool_call>", "</tool_call>"),
        stop=["STOP"],
    )
    text = '<think>why</think>Hi <tool_call>{"a": 1}</tool_call> there ST'
    segs = []
    for i in range(0, len(text), 3):  # cut every marker somewhere
        segs += p.feed(text[i : i + 3])
    segs += p.feed("OP and more", final=True)
    joined = {}
    for kind, t in segs:
        joined[kind] = joined.get(kind, "") + t
    assert joined == {"reasoning": "why", "normal": "Hi  there "}
    assert p.tool_calls == ['{"a": 1}'] and p.stopped_by == "STOP"
