"""POST /v1/responses, driven by the official openai SDK and by the real Codex CLI.

The same conversation through chat completions is the reference: greedy text,
prompt and tokens must agree. Every streamed event must validate as the SDK's
own event type.
"""

import json
import os
import shutil
import subprocess
import time
import typing
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
openai = pytest.importorskip("openai")  # the SDKs, as absent there
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter
from helpers import (
    MESSAGES,
    TOOLS_OA,
    LiveServer,
    ScriptedModel,
    make_tokenizer,
    slow_provider,
)

from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.server.responses_schema import ResponsesRequest, template_args
from mlx_dflash.target import Target

EVENT = TypeAdapter(ResponseStreamEvent)
# Each event type's own SDK class.
EVENT_CLASSES = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}
TOOLS_RS = [{"type": "function", **t["function"]} for t in TOOLS_OA]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def raw_events(srv, body) -> list:
    """POST a streaming request; each SSE event validated as an SDK event type."""
    events = []
    with httpx.stream(
        "POST", srv.url + "/v1/responses", json={**body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                event = EVENT.validate_python(data)
                assert type(event) is EVENT_CLASSES[name], name
                events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    return events


def sdk_stream(srv, **kw):
    """The SDK's own stream: every event is its class for that type."""
    events = list(srv.openai.responses.create(stream=True, **kw))
    for e in events:
        assert type(e) is EVENT_CLASSES[e.type], e.type
    return events


def test_responses_match_chat(srv):
    r = srv.openai.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=20
    )
    text = r.choices[0].message.content
    kw = dict(
        model="tiny",
        instructions=MESSAGES[0]["content"],
        input=MESSAGES[1]["content"],
        max_output_tokens=20,
    )
    resp = srv.openai.responses.create(**kw)
    assert resp.output_text == text
    assert resp.status == (
        "incomplete" if r.choices[0].finish_reason == "length" else "completed"
    )
    assert resp.usage.input_tokens == r.usage.prompt_tokens
    assert resp.usage.output_tokens == r.usage.completion_tokens
    assert resp.usage.total_tokens == r.usage.total_tokens
    assert resp.usage.input_tokens_details.cached_tokens > 0  # chat's prompt, reused
    assert resp.model_extra["mlx_dflash"]["engine"] == "speculative-greedy"

    # Input items (a developer message, text parts) render the same prompt.
    items = [
        {"role": "developer", "content": MESSAGES[0]["content"]},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": MESSAGES[1]["content"]}],
        },
    ]
    events = sdk_stream(srv, model="tiny", input=items, max_output_tokens=20)
    final = events[-1].response
    assert events[-1].type == f"response.{resp.status}"
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta")
        == text
    )
    assert (
        final.output_text == text and final.usage.input_tokens == r.usage.prompt_tokens
    )

    events = raw_events(srv, {**kw, "store": False})
    kinds = [e.type for e in events]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert events[-1].response.output_text == text


def test_tool_round_trip(tool_srv):
    """call -> function_call_output -> the next answer, stateless and stored."""
    kw = dict(model="tiny", input=ASK, tools=TOOLS_RS, max_output_tokens=30)
    r = tool_srv.openai.responses.create(**kw)
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text == "hmm, weather"
    assert r.output_text == "Let me check."
    call = r.output[2]
    assert call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Paris"
    }
    assert call.call_id and r.status == "completed"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens

    # Streaming: the same items, event by event (raw SSE and the SDK's helper).
    events = raw_events(tool_srv, kw)
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [o.type for o in done] == ["reasoning", "message", "function_call"]
    assert done[2].name == "get_weather" and done[2].arguments == call.arguments
    reasoning = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(reasoning) == "hmm, weather"
    args = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args[0].arguments) == {"city": "Paris"}
    with tool_srv.openai.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]

    # The result goes back; the prompt is the chat API's for the same history.
    history = ASK + [o.model_dump(exclude_none=True) for o in r.output]
    history.append(
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    )
    r2 = tool_srv.openai.responses.create(**{**kw, "input": history})
    chat = tool_srv.openai.chat.completions.create(
        model="tiny",
        tools=TOOLS_OA,
        max_tokens=30,
        messages=ASK
        + [
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
        ],
    )
    assert r2.usage.input_tokens == chat.usage.prompt_tokens
    assert r2.output_text == chat.choices[0].message.content
    assert r2.usage.input_tokens_details.cached_tokens > 0
    events = sdk_stream(tool_srv, **{**kw, "input": history})
    assert events[-1].response.usage.input_tokens == chat.usage.prompt_tokens

    # Stored: previous_response_id carries the history (not the instructions).
    r3 = tool_srv.openai.responses.create(
        **{**kw, "input": history[-1:]}, previous_response_id=r.id
    )
    assert r3.usage.input_tokens == r2.usage.input_tokens
    assert tool_srv.openai.responses.retrieve(r.id).output_text == r.output_text
    with pytest.raises(openai.BadRequestError, match="not found"):
        tool_srv.openai.responses.create(**kw, previous_response_id="resp_nope")
    unstored = tool_srv.openai.responses.create(**kw, store=False)
    with pytest.raises(openai.NotFoundError):
        tool_srv.openai.responses.retrieve(unstored.id)
    tool_srv.openai.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError):
        tool_srv.openai.responses.create(**kw, previous_response_id=r.id)

    # Parallel calls off still calls; tool_choice "none" hides the tools.
    r = tool_srv.openai.responses.create(**kw, parallel_tool_calls=False)
    assert [o.type for o in r.output][-1] == "function_call"
    r = tool_srv.openai.responses.create(**kw, tool_choice="none")
    assert all(o.type != "function_call" for o in r.output)


def test_hosted_tools_are_dropped_and_namespaces_kept(tool_srv):
    """What Codex sends: web_search (dropped) and namespaced functions."""
    base = dict(model="tiny", input=ASK, max_output_tokens=30)
    plain = tool_srv.openai.responses.create(**base, tools=TOOLS_RS)
    hosted = [{"type": "web_search", "external_web_access": False}]
    r = tool_srv.openai.responses.create(**base, tools=TOOLS_RS + hosted)
    assert r.usage.input_tokens == plain.usage.input_tokens
    ns = {"type": "namespace", "name": "weather", "description": "", "tools": TOOLS_RS}
    r = tool_srv.openai.responses.create(**base, tools=[ns] + hosted)
    assert r.usage.input_tokens == plain.usage.input_tokens
    assert r.output[-1].name == "get_weather" and r.output[-1].namespace == "weather"


def test_reasoning_effort_sets_the_thinking_switch():
    def args(effort):
        return template_args(ResponsesRequest(model="x", reasoning={"effort": effort}))

    assert (
        template_args(ResponsesRequest(model="x", reasoning={"summary": "auto"}))
        is None
    )
    assert args("none") == {"enable_thinking": False, "reasoning_effort": "low"}
    assert args("high") == {"enable_thinking": True, "reasoning_effort": "high"}


def test_bad_input_gets_4xx_in_openai_format(srv):
    good = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    cases = [
        ("{not json", 400),
        ({**good, "input": 7}, 400),
        ({**good, "input": []}, 400),
        ({**good, "input": [{"role": "robot", "content": "x"}]}, 400),
        ({**good, "input": [{"type": "item_reference", "id": "x"}]}, 400),
        (
            {
                **good,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "x"}],
                    }
                ],
            },
            400,
        ),
        (
            {
                **good,
                "input": [
                    {
                        "type": "function_call",
                        "call_id": "c",
                        "name": "f",
                        "arguments": "{",
                    }
                ],
            },
            400,
        ),
        ({**good, "tools": TOOLS_RS, "tool_choice": "required"}, 400),
        ({**good, "text": {"format": {"type": "json_schema"}}}, 400),
        ({**good, "max_output_tokens": 0}, 400),
        ({**good, "previous_response_id": "resp_unknown"}, 400),
        ({**good, "model": "gpt-nope"}, 404),
    ]
    for body, status in cases:
        data = body if isinstance(body, str) else json.dumps(body)
        r = httpx.post(
            srv.url + "/v1/responses",
            content=data,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == status, (body, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(srv.url + "/v1/responses/resp_unknown").status_code == 404
    # Unknown fields are ignored, as Codex's client_metadata is.
    r = httpx.post(
        srv.url + "/v1/responses", json={**good, "bogus": 1, "truncation": "auto"}
    )
    assert r.status_code == 200 and r.json()["status"] in ("completed", "incomplete")


def test_engine_errors_fail_the_response():
    s = LiveServer(slow_provider(), request_timeout=0.5)
    try:
        body = {"model": "tiny", "input": "go", "max_output_tokens": 5000}
        r = httpx.post(s.url + "/v1/responses", json=body, timeout=30)
        assert (
            r.status_code == 504 and "--request-timeout" in r.json()["error"]["message"]
        )
        events = raw_events(s, body)
        assert events[-1].type == "response.failed"
        assert events[-1].response.status == "failed"
        assert "--request-timeout" in events[-1].response.error.message
    finally:
        s.close()


# ---- the real Codex CLI ---------------------------------------------------------------

CODEX_VERSION = "0.171.0"
NPM_CACHE = Path.home() / ".cache" / "mlx-dflash" / "npm"
SENTENCE = "Hello from mlx-dflash."


def codex_binary() -> Path:
    """Codex from its npm package, installed once into NPM_CACHE."""
    exe = NPM_CACHE / "node_modules" / ".bin" / "codex"
    pkg = NPM_CACHE / "node_modules" / "@openai" / "codex" / "package.json"
    if pkg.exists() and json.loads(pkg.read_text())["version"] == CODEX_VERSION:
        return exe
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (.ci/run installs it)")
    probe = subprocess.run(
        ["npm", "view", f"@openai/codex@{CODEX_VERSION}", "version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        print(f"npm registry unreachable: {probe.stderr.strip()[-300:]}")
        pytest.skip("the npm registry can't be reached to install @openai/codex")
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "npm",
            "i",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(NPM_CACHE),
            f"@openai/codex@{CODEX_VERSION}",
        ],
        check=True,
        timeout=300,
    )
    return exe


def test_codex_exec(tmp_path):
    """`codex exec` and `codex exec resume` answer from a live server, offline."""
    exe = codex_binary()
    tok = make_tokenizer([SENTENCE])
    ids = [tok.convert_tokens_to_ids(w) for w in ["\n", SENTENCE, "<|im_end|>"]]
    model = ScriptedModel(len(tok), dict(zip(ids, ids[1:])), default=ids[-1])
    # Codex's first request is ~40k characters: one token each here.
    s = LiveServer(
        lambda: (Target(model), tok, PromptLookupDrafter(), 4),
        api_key="codex-test-key",
        max_context=200_000,
    )
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "MLX_DFLASH_KEY": "codex-test-key",
    }
    provider = (
        '{name="local", base_url="%s/v1", env_key="MLX_DFLASH_KEY", '
        'wire_api="responses", request_max_retries=0, stream_max_retries=0}' % s.url
    )
    config = {
        "model_provider": "local",
        "model_providers.local": provider,
        "sandbox_mode": '"read-only"',
        "analytics.enabled": "false",
        "check_for_update_on_startup": "false",
    }
    flags = [a for k, v in config.items() for a in ("-c", f"{k}={v}")]

    def codex(*args):
        cmd = [str(exe), "exec", *args, "--skip-git-repo-check", *flags, "-m", "tiny"]
        tic = time.perf_counter()
        run = subprocess.run(
            cmd,
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        print(f"codex exec {' '.join(args)}: {time.perf_counter() - tic:.1f} s")
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    try:
        assert SENTENCE in codex("say hi")
        registry = s.engine.metrics.registry
        first = registry.get_sample_value("mlx_dflash_prompt_cached_tokens_total")
        # The next turn resends the whole history: its prefix is in the cache.
        assert SENTENCE in codex("resume", "--last", "say hi again")
        again = registry.get_sample_value("mlx_dflash_prompt_cached_tokens_total")
        assert again - first > 10_000
        accepted = {"api": "openai-responses", "status": "accepted"}
        assert registry.get_sample_value("mlx_dflash_requests_total", accepted) == 2
    finally:
        s.close()
