"""Tools sent to a model whose chat template ignores them: the generic format.

A scripted target emits `<tool_call>` JSON as plain text, cut across tokens;
both APIs must hand it back as tool calls, streaming or not.
"""

import json

import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from mlx_lm.tokenizer_utils import TokenizerWrapper
from helpers import (
    MESSAGES,
    TOOLS_AN,
    TOOLS_OA,
    LiveServer,
    ScriptedModel,
    make_tokenizer,
)

from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.server.common import encode_chat
from mlx_dflash.server.openai_schema import Message, chat_messages
from mlx_dflash.server.output import parse_tool_calls
from mlx_dflash.server.tools import GENERIC_TOOL_PROMPT, tool_format
from mlx_dflash.target import Target

# tests/test_server.py's TEMPLATE without its tools branch and tool_calls loop.
PLAIN_TEMPLATE = (
    "{%- for m in messages %}"
    "<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TIME_OA = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now",
        "parameters": {"type": "object", "properties": {}},
    },
}
TOOLS2_OA = TOOLS_OA + [TIME_OA]
TOOLS2_AN = TOOLS_AN + [
    {
        "name": "get_time",
        "description": "The time now",
        "input_schema": TIME_OA["function"]["parameters"],
    }
]
# The calls come out as plain text; the first one's markers are cut across tokens.
CHAIN = [
    "\n",
    "Let me check.",
    '<tool_call>{"name": "get_',
    'weather", "arguments": {"city": "Paris"}}</tool',
    "_call>",
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    "<|im_end|>",
]
INSTRUCTION = GENERIC_TOOL_PROMPT.split("{tools}")[1].strip()


def plain_tokenizer(words=()) -> TokenizerWrapper:
    """The test tokenizer, its template ignoring tools; no tool markers (as SmolLM2)."""
    hf = make_tokenizer(words)._tokenizer
    hf.chat_template = PLAIN_TEMPLATE
    return TokenizerWrapper(hf)


@pytest.fixture(scope="module")
def gen_srv():
    tok = plain_tokenizer(CHAIN[1:-1])
    ids = [tok.convert_tokens_to_ids(w) for w in CHAIN]
    script = dict(zip(ids, ids[1:]))
    target = Target(ScriptedModel(len(tok), script, default=ids[-1]))
    s = LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4))
    yield s
    s.close()


def rendered(srv, messages, tools=None) -> str:
    return srv.engine.tokenizer.decode(encode_chat(srv.engine, messages, tools))


def test_tools_are_rendered_in_the_system_message(gen_srv):
    assert tool_format(gen_srv.engine.tokenizer) == "generic"
    without = rendered(gen_srv, [dict(m) for m in MESSAGES])
    text = rendered(gen_srv, [dict(m) for m in MESSAGES], TOOLS2_OA)
    assert text != without and INSTRUCTION in text
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    for t in TOOLS2_OA:
        assert json.dumps(t["function"]) in text  # name, description, parameters
    # No system message: the tools get one of their own.
    text = rendered(gen_srv, [dict(MESSAGES[1])], TOOLS2_OA)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    # The server counts them (the symptom: equal counts with and without tools).
    r = gen_srv.openai.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=1
    )
    r2 = gen_srv.openai.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS2_OA, max_tokens=1
    )
    with_tools = encode_chat(gen_srv.engine, [dict(m) for m in MESSAGES], TOOLS2_OA)
    assert r2.usage.prompt_tokens == len(with_tools) > r.usage.prompt_tokens


def test_generic_calls_openai(gen_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = gen_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS2_OA, max_tokens=40
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert json.loads(calls[1].function.arguments) == {}

    chunks = list(
        gen_srv.openai.chat.completions.create(
            model="tiny", messages=msgs, tools=TOOLS2_OA, max_tokens=40, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [tc.index for tc in streamed] == [0, 1] and all(tc.id for tc in streamed)
    assert [tc.function.name for tc in streamed] == ["get_weather", "get_time"]
    assert json.loads(streamed[0].function.arguments) == {"city": "Paris"}
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # Without tools the same text stays text: nothing is parsed out of it.
    r = gen_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=40
    )
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "<tool_call>" in r.choices[0].message.content


def test_generic_calls_anthropic(gen_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    m = gen_srv.anthropic.messages.create(
        model="claude-local", max_tokens=40, tools=TOOLS2_AN, messages=msgs
    )
    assert [b.type for b in m.content] == ["text", "tool_use", "tool_use"]
    assert m.content[0].text == "Let me check."
    assert m.content[1].name == "get_weather"
    assert m.content[1].input == {"city": "Paris"}
    assert m.content[2].name == "get_time" and m.content[2].input == {}
    assert m.stop_reason == "tool_use"

    with gen_srv.anthropic.messages.stream(
        model="claude-local", max_tokens=40, tools=TOOLS2_AN, messages=msgs
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_history_renders_calls_and_results(gen_srv):
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    r = gen_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS2_OA, max_tokens=40
    )
    calls = r.choices[0].message.tool_calls
    msgs += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        {"role": "tool", "tool_call_id": calls[1].id, "content": "noon"},
    ]
    typed = [Message.model_validate(m) for m in msgs]
    text = rendered(gen_srv, chat_messages(typed), TOOLS2_OA)
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\nLet me check.\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "</tool_call>\n"
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nnoon\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    r2 = gen_srv.openai.chat.completions.create(
        model="tiny", messages=msgs, tools=TOOLS2_OA, max_tokens=40
    )
    assert r2.choices[0].finish_reason == "tool_calls"
    n = len(gen_srv.engine.tokenizer.encode(text))
    assert r2.usage.prompt_tokens == n

    # The same turn through the Anthropic API renders the same prompt.
    m = gen_srv.anthropic.messages.create(
        model="claude-local", max_tokens=40, tools=TOOLS2_AN, messages=msgs[:1]
    )
    history = msgs[:1] + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": m.content[1].id, "content": c}
                for c in ["sunny"]
            ]
            + [
                {"type": "tool_result", "tool_use_id": m.content[2].id, "content": c}
                for c in ["noon"]
            ],
        },
    ]
    count = gen_srv.anthropic.messages.count_tokens(
        model="claude-local", tools=TOOLS2_AN, messages=history
    )
    assert count.input_tokens == n


def test_bad_calls_are_handled_as_the_native_path_does(gen_srv, tool_srv):
    texts = ['{"name": "no_such_tool", "arguments": {}}', '{"name": "get_', "[1, 2]"]
    # Malformed JSON is dropped, unknown names pass on (the client answers them).
    want = [{"name": "no_such_tool", "arguments": {}}]
    for srv in (gen_srv, tool_srv):
        assert parse_tool_calls(srv.engine.tokenizer, texts, TOOLS2_OA) == want


def test_native_template_is_unchanged(tool_srv):
    tok = tool_srv.engine.tokenizer
    assert tool_format(tok) == "native"
    msgs = [dict(m) for m in MESSAGES]
    want = tok.apply_chat_template(msgs, tools=TOOLS_OA, add_generation_prompt=True)
    assert encode_chat(tool_srv.engine, msgs, TOOLS_OA) == list(want)


def test_models_say_which_tool_format(gen_srv, tool_srv):
    for srv, fmt in ((gen_srv, "generic"), (tool_srv, "native")):
        card = srv.openai.models.list().data[0]
        assert card.model_extra["mlx_dflash"]["tool_format"] == fmt
