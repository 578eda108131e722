"""The real Claude Code CLI against the live server: one answer, one tool turn.

Claude Code comes from the npm registry, installed once into
~/.cache/mlx-dflash/npm/claude-code-VERSION. A scripted target answers on cue;
a recorder in front of the app keeps every request the CLI sends and the reply.
The character-level test tokenizer makes ~50-90k tokens of Claude Code's
prompt, which the layer-less scripted target prefills in a fraction of a second.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from helpers import BranchModel, LiveServer, ScriptedModel, make_tokenizer

from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.server.anthropic_schema import MessagesRequest, chat_messages
from mlx_dflash.target import Target

VERSION = "2.1.332"
INSTALL = Path.home() / ".cache" / "mlx-dflash" / "npm" / f"claude-code-{VERSION}"
KEY = "sk-local-throwaway"
HELLO = "Hello from mlx-dflash."


def _npm(*args, timeout=300):
    return subprocess.run(
        ["npm", *args], capture_output=True, text=True, timeout=timeout
    )


def _claude_binary(root: Path):
    """The native binary: the platform package's, or the wrapper's once its
    postinstall copied it there."""
    found = sorted(root.glob("node_modules/@anthropic-ai/claude-code-*/claude"))
    for exe in found + [root / "node_modules" / ".bin" / "claude"]:
        try:
            out = subprocess.run(
                [str(exe), "--version"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if out.returncode == 0 and VERSION in out.stdout:
            return exe
    return None


@pytest.fixture(scope="module")
def claude():
    exe = _claude_binary(INSTALL)
    if exe:
        return exe
    assert shutil.which("npm"), "npm is needed to install Claude Code (.ci/run)"
    try:
        seen = _npm(
            "view", f"@anthropic-ai/claude-code@{VERSION}", "version", timeout=60
        )
    except subprocess.TimeoutExpired:
        seen = None
    if seen is None or seen.returncode != 0:
        why = "timed out" if seen is None else " / ".join(seen.stderr.splitlines()[:2])
        print(f"npm registry unreachable: {why}")
        pytest.skip(f"npm registry unreachable: {why}")
    # Install beside the final directory, then rename: a half-done install is
    # never reused.
    tmp = INSTALL.with_name(INSTALL.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    out = _npm(
        "install",
        "--prefix",
        str(tmp),
        "--no-audit",
        "--no-fund",
        "--no-save",
        f"@anthropic-ai/claude-code@{VERSION}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    shutil.rmtree(INSTALL, ignore_errors=True)
    tmp.rename(INSTALL)
    exe = _claude_binary(INSTALL)
    assert exe, f"no runnable claude {VERSION} under {INSTALL}"
    return exe


class Recorder:
    """ASGI wrapper: each request's method, path, query, headers and body, and
    the status and body of its reply."""

    def __init__(self, app):
        self.app, self.log = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        e = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
            "body": b"",
            "reply": b"",
        }
        self.log.append(e)

        async def recv():
            m = await receive()
            if m["type"] == "http.request":
                e["body"] += m.get("body", b"")
            return m

        async def reply(m):
            if m["type"] == "http.response.start":
                e["status"] = m["status"]
                e["reply_headers"] = {k.decode(): v.decode() for k, v in m["headers"]}
            elif m["type"] == "http.response.body":
                e["reply"] += m.get("body", b"")
            await send(m)

        await self.app(scope, recv, reply)

    def messages(self):
        """The POST /v1/messages requests, body parsed."""
        return [
            {**e, "json": json.loads(e["body"])}
            for e in self.log
            if e["method"] == "POST" and e["path"] == "/v1/messages"
        ]


def claude_server(provider) -> LiveServer:
    """A live server with the recorder around its app (`srv.app.log`)."""
    # Room for Claude Code's prompt and its max_tokens (128000) in characters.
    return LiveServer(provider, api_key=KEY, wrap=Recorder, max_context=300_000)


def run_claude(exe, srv, tmp_path, prompt, *args):
    """`claude -p PROMPT --output-format json ...` offline against `srv`."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": srv.url,
        "ANTHROPIC_API_KEY": KEY,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    cmd = [str(exe), "-p", prompt, "--output-format", "json", *args]
    out = subprocess.run(
        cmd,
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    return json.loads(out.stdout)


def sse(reply: bytes):
    """The data of each server-sent event, parsed."""
    lines = reply.decode().splitlines()
    return [json.loads(l[6:]) for l in lines if l.startswith("data: ")]


def check_shape(e, srv):
    """One Claude Code turn as DESIGN.md §5 describes it, answered 200 by a stream."""
    assert e["query"] == "beta=true"
    h, body = e["headers"], e["json"]
    assert h["x-api-key"] == KEY and h["anthropic-version"] == "2023-06-01"
    assert "claude-code-20250219" in h["anthropic-beta"]
    assert h["user-agent"].startswith(f"claude-cli/{VERSION}")
    assert body["stream"] is True and "temperature" not in body
    assert body["context_management"]["edits"]
    assert len(body["system"]) >= 3
    assert any("cache_control" in b for b in body["system"])
    names = {t["name"] for t in body["tools"]}
    assert {"Bash", "Read", "Edit", "Write"} <= names and len(names) >= 10
    assert all("input_schema" in t for t in body["tools"])
    assert len(e["body"]) > 40_000
    assert e["status"] == 200
    assert e["reply_headers"]["content-type"].startswith("text/event-stream")
    events = sse(e["reply"])
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    n_prompt = events[0]["message"]["usage"]["input_tokens"]
    assert 40_000 < n_prompt < srv.engine.config.max_context
    return events


def text_of(events):
    return "".join(
        ev["delta"].get("text", "")
        for ev in events
        if ev["type"] == "content_block_delta"
    )


def hello_provider():
    tok = make_tokenizer([HELLO])
    ids = {w: tok.convert_tokens_to_ids(w) for w in ["\n", HELLO, "<|im_end|>"]}
    script = {ids["\n"]: ids[HELLO], ids[HELLO]: ids["<|im_end|>"]}
    target = Target(ScriptedModel(len(tok), script, default=ids["<|im_end|>"]))
    return lambda: (target, tok, PromptLookupDrafter(), 4)


@pytest.mark.parametrize("model", [None, "claude-sonnet-4-5"])
def test_claude_code_answers(claude, tmp_path, model):
    """`claude -p` with its default model (adaptive thinking, mid-conversation
    system turn) and with Sonnet 4.5 (thinking enabled, 32000 max_tokens)."""
    srv = claude_server(hello_provider())
    try:
        args = ["--model", model] if model else []
        result = run_claude(claude, srv, tmp_path, "say hello", *args)
    finally:
        srv.close()
    assert result["is_error"] is False and result["result"] == HELLO
    log = srv.app.log
    assert all(e["status"] == 200 for e in log), [(e["path"], e["status"]) for e in log]
    assert {e["path"] for e in log} <= {
        "/",
        "/v1/messages",
        "/v1/messages/count_tokens",
    }
    turns = srv.app.messages()
    assert len(turns) == 1
    body = turns[0]["json"]
    events = check_shape(turns[0], srv)
    assert text_of(events) == HELLO
    assert (
        result["usage"]["input_tokens"] == events[0]["message"]["usage"]["input_tokens"]
    )
    if model is None:
        assert body["thinking"]["type"] == "adaptive" and body["max_tokens"] == 128000
        assert [m["role"] for m in body["messages"]] == ["user", "system"]
    else:
        assert body["model"] == model and body["max_tokens"] == 32000
        assert body["thinking"]["type"] == "enabled"
        assert body["thinking"]["budget_tokens"] == 31999
        assert sum(len(b["text"]) for b in body["system"]) > 20_000


def test_branch_model_reads_its_context():
    tok = make_tokenizer(["MARK"])
    a, b, c, m = (tok.convert_tokens_to_ids(x) for x in ("a", "b", "c", "MARK"))
    model = BranchModel(len(tok), m, {a: b}, {a: c}, default=a)
    for prompt, want in (([b, a], b), ([m, b, a], c), ([b, m, a], c)):
        cache = model.make_cache()
        logits = model(mx.array([prompt]), cache)
        assert logits[0, -1].argmax().item() == want
        # One token more through the cache: the marker stays seen.
        assert model(mx.array([[a]]), cache)[0, -1].argmax().item() == want


def test_claude_code_runs_a_tool(claude, tmp_path):
    """The model calls Read on a file; only its content holds the marker token,
    so the next turn (carrying the tool_result) is answered with text."""
    (tmp_path / "work").mkdir()
    note = tmp_path / "work" / "notes.txt"
    marker, answer = "pineapple-7391", "The note names a pineapple."
    note.write_text(marker + "\n")
    call = json.dumps({"name": "Read", "arguments": {"file_path": str(note)}})
    tok = make_tokenizer([marker, answer, call])
    ids = {
        w: tok.convert_tokens_to_ids(w)
        for w in [
            "\n",
            "<tool_call>",
            "</tool_call>",
            "<|im_end|>",
            marker,
            answer,
            call,
        ]
    }
    before = ["\n", "<tool_call>", call, "</tool_call>", "<|im_end|>"]
    after = ["\n", answer, "<|im_end|>"]
    model = BranchModel(
        len(tok),
        ids[marker],
        {ids[x]: ids[y] for x, y in zip(before, before[1:])},
        {ids[x]: ids[y] for x, y in zip(after, after[1:])},
        default=ids["<|im_end|>"],
    )
    target = Target(model)
    srv = claude_server(lambda: (target, tok, PromptLookupDrafter(), 4))
    try:
        result = run_claude(
            claude, srv, tmp_path, "What does notes.txt say?", "--allowedTools", "Read"
        )
    finally:
        srv.close()
    assert result["is_error"] is False and result["result"] == answer
    assert result["num_turns"] == 2 and result["permission_denials"] == []
    log = srv.app.log
    assert all(e["status"] == 200 for e in log), [(e["path"], e["status"]) for e in log]
    turns = srv.app.messages()
    assert len(turns) == 2
    first = check_shape(turns[0], srv)
    uses = [
        ev["content_block"]
        for ev in first
        if ev["type"] == "content_block_start"
        and ev["content_block"]["type"] == "tool_use"
    ]
    assert len(uses) == 1 and uses[0]["name"] == "Read"
    assert first[-2]["delta"]["stop_reason"] == "tool_use"
    second = check_shape(turns[1], srv)
    assert text_of(second) == answer
    # Claude Code ran Read: its result, with the file's content, came back.
    msgs = turns[1]["json"]["messages"]
    sent = [b for m in msgs if m["role"] == "assistant" for b in m["content"]]
    assert any(
        b["type"] == "tool_use"
        and b["id"] == uses[0]["id"]
        and b["input"] == {"file_path": str(note)}
        for b in sent
    )
    results = [
        b
        for m in msgs
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert len(results) == 1 and results[0]["tool_use_id"] == uses[0]["id"]
    assert marker in json.dumps(results[0]["content"])
    assert not results[0].get("is_error")
    assert marker not in json.dumps(turns[0]["json"])


def test_mid_conversation_system_turn_joins_the_user_turn():
    """Claude Code's default model puts a system turn after the user's message
    (beta per-turn-control); chat templates get it as part of a user turn."""
    req = MessagesRequest(
        model="claude-opus-5-5",
        max_tokens=8,
        system=[{"type": "text", "text": "S"}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Env"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "system", "content": "late"},
        ],
    )
    assert chat_messages(req) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi\n<system-reminder>\n# Env\n</system-reminder>"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "<system-reminder>\nlate\n</system-reminder>"},
    ]
