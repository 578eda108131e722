"""Malformed requests get a 4xx in their API's own error format, never a 500 or a hang.

One case per malformed class found by hand, then hypothesis bodies: a valid
skeleton per endpoint with fields replaced, deleted or added (random JSON values,
huge integers, lone surrogates), and raw bodies that are not JSON.
"""

import copy
import json
import logging

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import MESSAGES, LiveServer, random_provider

CHAT = {
    "model": "tiny",
    "max_tokens": 2,
    "temperature": 0.5,
    "seed": 3,
    "stop": ["zz"],
    "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get",
                "description": "d",
                "parameters": {"type": "object", "properties": {"city": {}}},
            },
        }
    ],
    "chat_template_kwargs": {"enable_thinking": False},
}
COMPLETION = {
    "model": "tiny",
    "prompt": "Once upon",
    "max_tokens": 2,
    "stop": "zz",
    "logprobs": 1,
    "temperature": 0.5,
    "seed": 1,
}
CONVERSATION = {
    "model": "claude-x",
    "system": [{"type": "text", "text": "Be terse."}],
    "messages": [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"c": "O"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "sunny"}],
                },
                {"type": "text", "text": "And?"},
            ],
        },
    ],
    "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "thinking": {"type": "disabled"},
}
MESSAGES_BODY = {**CONVERSATION, "max_tokens": 2, "stop_sequences": ["zz"]}
RESPONSES = {
    "model": "tiny",
    "instructions": "Be terse.",
    "input": [
        {"role": "developer", "content": "Use tools."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather?"}],
        },
        {"type": "reasoning", "summary": [], "content": []},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "get",
            "description": "d",
            "parameters": {"type": "object", "properties": {"city": {}}},
        },
        {"type": "web_search"},
    ],
    "tool_choice": "auto",
    "reasoning": {"effort": "low"},
    "text": {"format": {"type": "text"}},
    "stream": False,
    "store": False,
    "max_output_tokens": 2,
}
ENDPOINTS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v1/messages": MESSAGES_BODY,
    "/v1/messages/count_tokens": CONVERSATION,
    "/v1/responses": RESPONSES,
}
# Real field names, so added fields often hit a validator.
FIELDS = sorted(
    {"stream", "stream_options", "n", "top_p", "top_k", "min_p", "logit_bias"}
    | {"response_format", "tool_choice", "parallel_tool_calls", "top_logprobs"}
    | {"max_completion_tokens", "echo", "suffix", "best_of", "metadata", "system"}
    | {"stop_sequences", "thinking", "content", "text", "type", "role", "name"}
    | {"tool_calls", "function", "arguments", "input", "input_schema", "is_error"}
    | {"tool_use_id", "tool_call_id", "id", "chat_template_kwargs", "seed"}
    | {"chat_template", "tokenize", "return_dict", "enable_thinking"}
    | {"instructions", "max_output_tokens", "previous_response_id", "reasoning"}
    | {"effort", "format", "call_id", "output", "namespace", "tools", "parameters"}
    | {k for body in ENDPOINTS.values() for k in body}
)
HUGE = [2**31, 2**63, 2**64, -(2**63) - 1, 10**30, -1]

text = (
    st.text(max_size=12)
    | st.text(st.characters(exclude_categories=()), max_size=6)  # surrogates too
    | st.sampled_from(["\ud800", "tiny", "claude-x", "", "text", "user", "tool"])
    | st.sampled_from(["assistant", "function", "tool_use", "tool_result", "image"])
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(HUGE)
    | st.floats()  # NaN and infinities too: Python's json reads them
    | text
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(FIELDS) | text, inner, max_size=4),
    max_leaves=12,
)


def _slots(body):
    """(container, key) for every value in `body`, the root's own fields included."""
    out, stack = [], [body]
    while stack:
        c = stack.pop()
        items = c.items() if isinstance(c, dict) else enumerate(c)
        for k, v in items:
            out.append((c, k))
            if isinstance(v, (dict, list)):
                stack.append(v)
    return out


@st.composite
def mutated(draw, skeleton):
    body = copy.deepcopy(skeleton)
    for _ in range(draw(st.integers(1, 3))):
        slots = _slots(body)
        if not slots:
            break
        c, k = draw(st.sampled_from(slots))
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "replace":
            c[k] = draw(values)
        elif op == "delete":
            c.pop(k)
        elif isinstance(c, dict):
            c[draw(st.sampled_from(FIELDS) | text)] = draw(values)
        else:
            c.append(draw(values))
    # Keep generations short; huge values are left to be refused.
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = body.get(key)
        if type(v) is int and 4 < v < 2**31:
            body[key] = 4
    return body


@pytest.fixture(scope="module")
def srv():
    s = LiveServer(random_provider())
    s.http = httpx.Client(base_url=s.url, timeout=30)  # a hang fails the test
    yield s
    s.http.close()
    s.close()


def post(srv, path, body, *, raw=False):
    # ensure_ascii: lone surrogates travel as \ud800 escapes
    data = body if raw else json.dumps(body)
    return srv.http.post(
        path, content=data, headers={"content-type": "application/json"}
    )


def check(path, r):
    """Below 500; a 4xx in the API's own format; no error inside a 200 stream."""
    assert r.status_code < 500, (path, r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()
        if path.startswith("/v1/messages"):
            assert err["type"] == "error", err
            assert isinstance(err["error"]["type"], str), err
            assert isinstance(err["error"]["message"], str), err
        else:
            assert set(err["error"]) == {"message", "type", "param", "code"}, err
            assert isinstance(err["error"]["message"], str), err
    elif r.headers["content-type"].startswith("text/event-stream"):
        for line in r.text.splitlines():
            if line.startswith("data:") and line != "data: [DONE]":
                event = json.loads(line[5:])
                assert "error" not in event and event.get("type") != "error", event
                assert event.get("type") != "response.failed", event


def still_serves(srv):
    assert srv.http.get("/health").json() == {"status": "ok"}
    r = post(srv, "/v1/chat/completions", {**CHAT, "max_tokens": 1})
    assert r.status_code == 200, r.text
    r = post(srv, "/v1/responses", {**RESPONSES, "max_output_tokens": 1})
    assert r.status_code == 200, r.text


# ---- one case per malformed class --------------------------------------------------

CH, CO, MS, CT, RS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
)
OA = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
AN = {"model": "claude-x", "max_tokens": 2, "messages": MESSAGES[1:]}
NESTED = "{% for a in messages %}{% for b in messages %}x{% endfor %}{% endfor %}"


def _oa_user(content, **extra):
    return {**OA, "messages": [{"role": "user", "content": content, **extra}]}


def _an_user(content):
    return {**AN, "messages": [{"role": "user", "content": content}]}


def _result(content):
    return _an_user([{"type": "tool_result", "tool_use_id": "t", "content": content}])


def _calls(calls):
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": calls}]
    return {**OA, "messages": history}


def _args(arguments):
    return _calls([{"function": {"name": "f", "arguments": arguments}}])


def _kwargs(**kw):
    return {**OA, "chat_template_kwargs": kw}


def _seed(seed, **kw):
    return {**OA, "temperature": 0.7, "seed": seed, **kw}


RB = {"model": "tiny", "input": "hi", "max_output_tokens": 2}


def _rs_items(*items, **kw):
    return {**RB, "input": list(items), **kw}


def _rs_call(**fields):
    return _rs_items({"type": "function_call", "call_id": "c", "name": "f", **fields})


def _rs_tool(**fields):
    return {**RB, "tools": [{"type": "function", "name": "f", **fields}]}


UNICODE = "string is not valid Unicode"
CASES = [
    # content parts and blocks
    (MS, _an_user([{"type": "text", "text": 5}]), 400, "content.0.text.text"),
    (CH, _oa_user([{"type": "text", "text": 5}]), 400, "messages.0.content.0.text"),
    (MS, _result(5), 400, "content.0.tool_result.content"),
    (MS, _result([7]), 400, "content.0.tool_result.content.0"),
    (MS, _result({"a": 1}), 400, "content.0.tool_result.content"),
    (MS, _an_user([5]), 400, "messages.0.content.0: must be a content block"),
    # tool calls and tools
    (CH, _calls({"id": "c"}), 400, "messages.2.tool_calls"),
    (CH, _calls("call"), 400, "messages.2.tool_calls"),
    (CH, _calls([5]), 400, "messages.2.tool_calls.0"),
    (CH, _calls([{"id": "c", "function": "f"}]), 400, "tool_calls.0.function"),
    (CH, _args("{"), 400, "function.arguments: tool call arguments are not valid"),
    (CH, _args("[1]"), 400, "function.arguments: tool call arguments must be"),
    (CH, _args('{"a": "\\ud800"}'), 400, "function.arguments: tool call arguments"),
    (CH, {**OA, "tools": [{"type": "function", "function": 3}]}, 400, "tools.0."),
    (MS, {**AN, "tools": [{"input_schema": {}}]}, 400, "tools.0.name"),
    (MS, {**AN, "tools": [{"type": "web_search", "name": "w"}]}, 400, "input_schema"),
    # lone surrogates, refused before any generation
    (CH, {**OA, "model": "tiny\ud800"}, 400, f"model: {UNICODE}"),
    (MS, {**AN, "model": "claude-\ud800"}, 400, f"model: {UNICODE}"),
    (CH, _oa_user("a\udc00"), 400, f"messages.0.content: {UNICODE}"),
    (MS, _an_user([{"type": "text", "text": "\ud83d"}]), 400, UNICODE),
    (CO, {"model": "tiny", "prompt": "x", "stop": ["\ud800"]}, 400, "stop.0"),
    (CT, {**AN, "metadata": {"\ud800": 1}}, 400, UNICODE),
    # seed: -1 means random; mx.random.key takes [0, 2**64)
    (CH, _seed(-1), 200, None),
    (CH, _seed(2**64 - 1), 200, None),
    (CH, _seed(2**64), 400, "seed: must be"),
    (CO, {"model": "tiny", "prompt": "x", "seed": 10**30}, 400, "seed: must be"),
    (CH, _seed(-2), 400, "seed: must be"),
    # chat_template_kwargs: only scalar switches
    (CH, _kwargs(chat_template=NESTED), 400, "chat_template_kwargs.chat_template"),
    (CH, _kwargs(tokenize=False), 400, "chat_template_kwargs.tokenize"),
    (CH, _kwargs(return_dict=True), 400, "chat_template_kwargs.return_dict"),
    (CH, _kwargs(enable_thinking=[1]), 400, "chat_template_kwargs.enable_thinking"),
    (CH, _kwargs(enable_thinking=False, reasoning_effort="low"), 200, None),
    # unknown fields are ignored, at the top and inside
    (CH, {**_oa_user("hi", x=2), "bogus": 1}, 200, None),
    (CO, {"model": "tiny", "prompt": "x", "max_tokens": 2, "bogus": {}}, 200, None),
    (CO, {"model": "tiny", "prompt": "x", "max_tokens": None}, 200, None),
    (
        MS,
        {**_an_user([{"type": "text", "text": "hi", "x": {}}]), "bogus": 1},
        200,
        None,
    ),
    (CT, {**AN, "bogus": None}, 200, None),
    # Responses: what each of these hit before its field was checked
    (RS, RESPONSES, 200, None),
    (RS, {**RESPONSES, "stream": True}, 200, None),
    (RS, {**RB, "reasoning": {"effort": [1]}}, 400, "reasoning.effort"),
    (RS, {**RB, "text": {"format": "json"}}, 400, "text.format"),
    (RS, {**RB, "metadata": {"k": 1}}, 400, "metadata.k"),
    (RS, {**RB, "metadata": {"k": float("nan")}}, 400, "NaN"),
    (RS, _rs_tool(parameters={"x": float("inf")}), 400, "NaN and Infinity"),
    (RS, {**RB, "metadata": {"\ud800": "v"}}, 400, UNICODE),
    (RS, {**RB, "instructions": "a\udc00"}, 400, f"instructions: {UNICODE}"),
    (RS, {**RB, "input": "\ud83d"}, 400, f"input: {UNICODE}"),
    (RS, _rs_items({"role": "user", "content": [{"type": "input_text"}]}), 200, None),
    (
        RS,
        _rs_items({"role": "user", "content": [{"type": "input_text", "text": 5}]}),
        400,
        "input[0].text must be a string",
    ),
    (RS, _rs_tool(name=5), 400, "tools.0.name"),
    (RS, _rs_tool(parameters="x"), 400, "tools.0.parameters"),
    (RS, _rs_tool(description=["d"]), 400, "tools.0.description"),
    (RS, {**RB, "tools": [{"type": "namespace", "tools": 5}]}, 400, "tools.0"),
    (RS, {**RB, "tools": [{"type": "namespace", "tools": [5]}]}, 400, "tools.0.tools"),
    (RS, {**RB, "tools": [{"type": "web_search", "name": 5}]}, 200, None),
    (RS, _rs_call(arguments='{"a": "\\ud800"}'), 400, "input[0].arguments"),
    (RS, _rs_call(arguments="[1]"), 400, "must be a JSON object"),
    (RS, _rs_call(arguments=5), 400, "must be a JSON string"),
    (RS, _rs_call(arguments={"a": 1}), 200, None),
    (RS, _rs_call(name=None), 400, "a call needs a name"),
    (RS, _rs_call(call_id={}), 400, "input[0].call_id"),
    (
        RS,
        _rs_items({"type": "function_call_output", "call_id": 5, "output": "x"}),
        400,
        "input[0].call_id",
    ),
    (RS, {**RB, "client_metadata": {"x": 1}, "truncation": "auto"}, 200, None),
    # not JSON at all
    (CH, b"\xff\xfe", 400, "not valid JSON"),
    (MS, b"[1, 2", 400, "not valid JSON"),
    (RS, b'{"model": "tiny", "input": "hi"', 400, "not valid JSON"),
]


@pytest.mark.parametrize("path,body,status,says", CASES)
def test_malformed_class(srv, path, body, status, says):
    r = post(srv, path, body, raw=isinstance(body, bytes))
    check(path, r)
    assert r.status_code == status, r.text
    if says is not None:
        err = r.json()["error"]
        assert says in err["message"], err


def test_unknown_fields_are_logged_once(srv, caplog):
    caplog.set_level(logging.DEBUG, logger="mlx_dflash.server.schema")
    for _ in range(2):
        body = {**OA, "max_tokens": 1, "fuzz_new_field": 1}
        assert post(srv, "/v1/chat/completions", body).status_code == 200
    said = [
        r.getMessage() for r in caplog.records if "fuzz_new_field" in r.getMessage()
    ]
    assert said == ["ignoring unknown request field ChatRequest.fuzz_new_field"]


def test_seed_is_deterministic_across_its_range(srv):
    for seed in (0, 2**63 + 5, 2**64 - 1):
        body = {**OA, "temperature": 1.0, "max_tokens": 4, "seed": seed}
        a, b = (post(srv, "/v1/chat/completions", body).json() for _ in range(2))
        assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_unexpected_error_is_json_in_the_api_format(srv, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(srv.engine, "check_memory", boom)
    for path, body in (("/v1/chat/completions", OA), ("/v1/messages", AN)):
        r = post(srv, path, body)
        assert r.status_code == 500
        err = r.json()
        if path == "/v1/messages":
            assert err["type"] == "error" and err["error"]["type"] == "api_error"
        else:
            assert err["error"]["type"] == "server_error"
    monkeypatch.undo()
    still_serves(srv)


# ---- property-based ----------------------------------------------------------------

FUZZ = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_fuzz_endpoint(srv, path):
    @FUZZ
    @given(body=st.one_of(mutated(ENDPOINTS[path]), mutated(ENDPOINTS[path]), values))
    def run(body):
        check(path, post(srv, path, body))

    run()
    still_serves(srv)


@settings(FUZZ, max_examples=60)
@given(
    path=st.sampled_from(sorted(ENDPOINTS)),
    raw=st.binary(max_size=40)
    | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | st.sampled_from(list(ENDPOINTS.values())).map(
        lambda b: json.dumps(b)[:-3].encode()
    ),
)
def test_fuzz_raw_bodies(srv, path, raw):
    check(path, post(srv, path, raw, raw=True))
