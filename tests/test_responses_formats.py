"""Qwen tool calls and reasoning through POST /v1/responses, streaming and not.

The scripted targets of helpers (the `servers` fixture) write each Qwen tool format
(XML in `<tool_call>`, a bare `<function=…>` block, JSON) with its markers cut
across tokens; here the official openai SDK reads them back as Responses
output items. A `BranchModel` (helpers) answers in text once the
function_call_output it reads holds its marker: a real tool round trip.
"""

import json

import pytest
from helpers import (
    ANSWER,
    CALLS,
    CHAINS,
    MSGS,
    REASONING,
    QWEN_TOOLS_OA,
    BranchModel,
    LiveServer,
    make_tokenizer,
    no_markup,
)

from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.target import Target

TOOLS_RS = [{"type": "function", **t["function"]} for t in QWEN_TOOLS_OA]


def stream_events(srv, **kw) -> list:
    """The SDK's stream; each event validated by the SDK as its own type."""
    events = list(srv.openai.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def joined(events, kind) -> str:
    return "".join(e.delta for e in events if e.type == f"response.{kind}.delta")


def check_items(output):
    """reasoning, the answer, then the two calls: exact names and JSON arguments."""
    assert [o.type for o in output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    reasoning, message, *calls = output
    assert [c.text for c in reasoning.content] == [REASONING]
    assert [c.type for c in message.content] == ["output_text"]
    assert message.content[0].text == ANSWER
    no_markup(message.content[0].text)
    no_markup(reasoning.content[0].text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert all(c.call_id and c.id for c in calls)  # no empty call, each its own id
    assert len({c.call_id for c in calls}) == len(calls)
    assert all(c.status == "completed" for c in output)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fmt", list(CHAINS))
def test_responses_tool_calls(servers, fmt, stream):
    srv = servers[fmt]
    kw = dict(model="tiny", input=MSGS, tools=TOOLS_RS, max_output_tokens=60)
    if not stream:
        r = srv.openai.responses.create(**kw)
    else:
        events = stream_events(srv, **kw)
        assert events[-1].type == "response.completed"
        r = events[-1].response
        # Reasoning and answer arrive apart, each in its own item's events.
        assert joined(events, "reasoning_text") == REASONING
        assert joined(events, "output_text") == ANSWER
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [o.model_dump() for o in done] == [o.model_dump() for o in r.output]
        args = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [json.loads(a.arguments) for a in args] == [a for _, a in CALLS]
        calls = [o for o in done if o.type == "function_call"]
        assert [a.item_id for a in args] == [c.id for c in calls]
    check_items(r.output)
    assert r.status == "completed" and r.output_text == ANSWER
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_responses_reasoning_without_tools_is_kept_apart(servers, stream):
    """No tools: the JSON call is answer text, the reasoning still its own item."""
    srv = servers["json"]
    kw = dict(model="tiny", input=MSGS, max_output_tokens=60)
    if stream:
        events = stream_events(srv, **kw)
        r = events[-1].response
        assert joined(events, "reasoning_text") == REASONING
        assert REASONING not in joined(events, "output_text")
    else:
        r = srv.openai.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == REASONING
    assert REASONING not in r.output_text and "<think" not in r.output_text
    assert '<tool_call>\n{"name": "get_weather"' in r.output_text


def test_responses_cut_off_call_is_dropped(servers):
    srv = servers["xml"]
    # Cut inside the first call's parameters, then after its </function>.
    for max_tokens, n_calls in ((7, 0), (9, 1)):
        r = srv.openai.responses.create(
            model="tiny", input=MSGS, tools=TOOLS_RS, max_output_tokens=max_tokens
        )
        assert r.status == "incomplete" and r.output_text == ANSWER
        calls = [o for o in r.output if o.type == "function_call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS[:n_calls]
        assert r.incomplete_details.reason == "max_output_tokens"


# ---- a real round trip: call -> function_call_output -> the answer in text ----------

MARKER, REPLY = "pineapple-7391", "It is sunny in Paris."
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def branch_srv():  # one per test: each starts with an empty prompt cache
    tok = make_tokenizer([MARKER, REPLY, CALL])
    before = ["\n", "<tool_call>", CALL, "</tool_call>", "<|im_end|>"]
    after = ["\n", REPLY, "<|im_end|>"]
    ids = {w: tok.convert_tokens_to_ids(w) for w in set(before + after + [MARKER])}
    model = BranchModel(
        len(tok),
        ids[MARKER],
        {ids[x]: ids[y] for x, y in zip(before, before[1:])},
        {ids[x]: ids[y] for x, y in zip(after, after[1:])},
        default=ids["<|im_end|>"],
    )
    target = Target(model)
    s = LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4))
    yield s
    s.close()


def respond(srv, stream, **kw):
    if not stream:
        return srv.openai.responses.create(**kw)
    events = stream_events(srv, **kw)
    assert events[-1].type == "response.completed"
    return events[-1].response


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(branch_srv, stream):
    srv = branch_srv
    kw = dict(model="tiny", tools=TOOLS_RS, max_output_tokens=30)
    first = respond(srv, stream, **kw, input=ASK)
    assert [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Paris"
    }
    assert first.output_text == ""
    assert first.usage.input_tokens_details.cached_tokens == 0

    # The client runs the tool; its output (holding the marker) goes back.
    history = ASK + [o.model_dump(exclude_none=True) for o in first.output]
    history.append(
        {
            "type": "function_call_output",
            "call_id": call.call_id,
            "output": f"sunny, 21 C ({MARKER})",
        }
    )
    second = respond(srv, stream, **kw, input=history)
    assert [o.type for o in second.output] == ["message"]
    assert second.output_text == REPLY and second.status == "completed"
    # The first turn's prompt was reused from the prompt cache.
    assert second.usage.input_tokens > first.usage.input_tokens
    cached = second.usage.input_tokens_details.cached_tokens
    assert first.usage.input_tokens <= cached < second.usage.input_tokens

    # Stored: previous_response_id carries the call; only the output is sent.
    third = respond(
        srv,
        stream,
        **kw,
        input=history[-1:],
        previous_response_id=first.id,
    )
    assert third.output_text == REPLY
    assert third.usage.input_tokens == second.usage.input_tokens
