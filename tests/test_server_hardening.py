"""The server survives real clients: abandoned, stalled, oversized and timed-out
requests, a context window that can't hold max_tokens, several API keys, and
shutdown while streams are open.

A scripted target that sleeps in every forward makes prefill and decoding
slow enough to abandon on cue; it never emits EOS, so answers run to max_tokens.
"""

import json
import signal
import socket
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from helpers import LiveServer, random_provider, serve_process, slow_provider
from models import save_tiny_model_dir

from mlx_dflash.server import Engine, EngineConfig

STEP = 8  # prefill chunk: cancellation is checked between chunks


@pytest.fixture(scope="module")
def slow():
    s = LiveServer(
        slow_provider(),
        prefill_step_size=STEP,
        stall_seconds=1.0,
        max_unread=64,
        max_context=20000,
    )
    yield s
    s.close()


def _chat(content, max_tokens=4, **extra):
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


def _cancelled(srv) -> float:
    total = 0.0
    for line in httpx.get(srv.url + "/metrics").text.splitlines():
        if line.startswith("mlx_dflash_generations_total{") and "cancelled" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_cancelled(srv, before, timeout=10.0):
    deadline = time.time() + timeout
    while _cancelled(srv) <= before:
        assert time.time() < deadline, "the abandoned job was not cancelled"
        time.sleep(0.05)


def _quick_answer(srv, limit=5.0):
    """A short request right now is answered within `limit` seconds."""
    tic = time.perf_counter()
    r = httpx.post(srv.url + "/v1/chat/completions", json=_chat("hi", 2), timeout=30)
    assert r.status_code == 200, r.text
    took = time.perf_counter() - tic
    assert took < limit, f"a short request waited {took:.1f} s"
    return took


# ---- cancellation that reaches the device ----------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_abandoned_long_prefill_frees_the_engine(slow, stream):
    # 4000 prompt tokens in chunks of 8 at 20 ms a chunk: ~10 s of prefill.
    body = _chat("x" * 4000, 16, stream=stream)
    before = _cancelled(slow)
    if stream:
        with httpx.stream(
            "POST", slow.url + "/v1/chat/completions", json=body, timeout=30
        ) as r:
            next(r.iter_lines())  # the stream has started: the job is queued
    else:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(slow.url + "/v1/chat/completions", json=body, timeout=1.0)
    _wait_cancelled(slow, before)
    _quick_answer(slow)


def test_stalled_reader_is_cancelled():
    # A client that stops reading: a small receive buffer, nothing read. The
    # model is fast, so the socket's buffers fill and the output backs up.
    big = "abcdefgh" * 256  # 2 KiB a token: the buffers fill in ~2,000 tokens
    slow = LiveServer(slow_provider(delay=0.0, word=big), stall_seconds=1.0)
    port = int(slow.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(_chat("go", 200000, stream=True)).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    before = _cancelled(slow)
    try:
        _wait_cancelled(slow, before, timeout=60)
        _quick_answer(slow)
    finally:
        sock.close()
        slow.close()


@pytest.mark.parametrize("stream", [True, False])
def test_slow_prefill_or_queueing_is_not_a_stall(slow, stream):
    # ~2.5 s of prefill, and a second request queued behind the first, with
    # the stall bound at 1 s: both answered in full.
    results = []

    def ask():
        body = _chat("p" * 1000, 8, stream=stream)
        with httpx.stream(
            "POST", slow.url + "/v1/chat/completions", json=body, timeout=60
        ) as r:
            results.append((r.status_code, "".join(r.iter_text())))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join()
    for status, text in results:
        assert status == 200
        if stream:
            assert '"finish_reason":"length"' in text.replace(" ", "")
        else:
            assert json.loads(text)["usage"]["completion_tokens"] == 8


def test_stall_check_counts_unread_events():
    # The mechanism alone, without sockets: an unread backlog past the bound.
    engine = Engine(slow_provider(delay=0.0), EngineConfig(max_unread=8)).start()
    try:
        import asyncio

        async def run():
            from mlx_dflash.server.job import Job

            job = engine.submit(Job(prompt=[5, 6, 7], max_tokens=10000))
            while not job.finished.is_set():
                await asyncio.sleep(0.01)
            return job

        job = asyncio.run(run())
        assert job.reason == "stalled"
        assert job.emitted < 100  # stopped soon after the backlog passed 8
    finally:
        engine.stop()


def test_request_timeout_in_each_api_format():
    s = LiveServer(slow_provider(), request_timeout=1.0)
    try:
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("go", 5000), timeout=30)
        assert r.status_code == 504
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "--request-timeout" in r.json()["error"]["message"]
        body = {**_chat("go", 5000), "model": "claude-x", "stream": True}
        with httpx.stream("POST", s.url + "/v1/messages", json=body, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("event:")]
        assert events[-1] == "event: error"
    finally:
        s.close()


# ---- nothing heavy on the event loop; size limits ---------------------------------


def test_huge_prompt_does_not_stall_health(slow):
    body = json.dumps(_chat("y" * (1 << 20), 2))
    done = threading.Event()
    result = {}

    def post():
        result["r"] = httpx.post(
            slow.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        done.set()

    threading.Thread(target=post).start()
    worst = 0.0
    with httpx.Client(base_url=slow.url, timeout=10) as client:
        client.get("/health")
        while not done.is_set():
            tic = time.perf_counter()
            assert client.get("/health").status_code == 200
            worst = max(worst, time.perf_counter() - tic)
            time.sleep(0.02)
    assert worst < 0.5, f"/health took {worst:.2f} s while a 1 MiB prompt was read"
    r = result["r"]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_body_limit_is_413_in_each_api_format():
    s = LiveServer(random_provider(), app_args={"max_request_bytes": 4000})
    try:
        big = _chat("q" * 5000)
        r = httpx.post(s.url + "/v1/chat/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"
        r = httpx.post(s.url + "/v1/messages", json={**big, "model": "claude-x"})
        assert r.status_code == 413
        assert r.json() == {
            "type": "error",
            "error": {"type": "request_too_large", "message": r.json()["error"]["message"]},
        }
        # A chunked body (no content-length) is counted as it arrives.
        chunks = (json.dumps(big).encode()[i : i + 1000] for i in range(0, 6000, 1000))
        r = httpx.post(
            s.url + "/v1/messages/count_tokens",
            content=chunks,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and r.json()["type"] == "error"
        # Under the limit, as before.
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("q" * 100))
        assert r.status_code == 200
    finally:
        s.close()


# ---- the context window ------------------------------------------------------------


def test_max_tokens_is_lowered_to_the_context_window():
    s = LiveServer(slow_provider(delay=0.0), max_context=64)
    try:
        prompt = s.engine.tokenizer.apply_chat_template(
            _chat("hello")["messages"], add_generation_prompt=True
        )
        room = 64 - len(prompt)
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("hello", 32000))
        assert r.status_code == 200, r.text
        assert r.headers["x-mlx-dflash-max-tokens"] == str(room)
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == room
        body = {**_chat("hello", 32000), "model": "claude-x"}
        r = httpx.post(s.url + "/v1/messages", json=body)
        assert r.status_code == 200 and r.json()["stop_reason"] == "max_tokens"
        assert r.headers["x-mlx-dflash-max-tokens"] == str(room)
        # Room left for all: no header.
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("hello", 3))
        assert "x-mlx-dflash-max-tokens" not in r.headers
        # The prompt alone over the window stays a 400.
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("z" * 80, 1))
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
    finally:
        s.close()


# ---- the prompt cache is per API key ------------------------------------------------


def test_prompt_cache_entries_are_per_key():
    s = LiveServer(random_provider(), api_key=["key-a", "key-b"])
    try:

        def cached(key):
            r = httpx.post(
                s.url + "/v1/chat/completions",
                json=_chat("a secret shared by nobody " * 3, 3),
                headers={"authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        assert cached("key-a") == 0
        assert cached("key-b") == 0  # key a's prompt is invisible to key b
        assert cached("key-a") > 0
        assert cached("key-b") > 0
        r = httpx.get(s.url + "/v1/models", headers={"x-api-key": "key-c"})
        assert r.status_code == 401
    finally:
        s.close()


# ---- shutdown -----------------------------------------------------------------------


def test_close_ends_running_and_queued_jobs():
    s = LiveServer(slow_provider())
    try:
        results = {}

        def ask(name, body, path="/v1/chat/completions"):
            results[name] = httpx.post(s.url + path, json=body, timeout=30)

        threads = [
            threading.Thread(target=ask, args=("running", _chat("go", 5000))),
            threading.Thread(
                target=ask,
                args=("queued", {**_chat("go", 5000), "model": "claude-x"}),
                kwargs={"path": "/v1/messages"},
            ),
        ]
        threads[0].start()
        time.sleep(0.5)
        threads[1].start()
        time.sleep(0.5)
        s.engine.close()
        for t in threads:
            t.join(timeout=10)
        assert results["running"].status_code == 503
        assert results["running"].json()["error"]["code"] == "server_shutting_down"
        assert results["queued"].status_code == 503
        assert results["queued"].json()["error"]["type"] == "overloaded_error"
        # New requests are refused the same way.
        r = httpx.post(s.url + "/v1/chat/completions", json=_chat("go"))
        assert r.status_code == 503
    finally:
        s.close()


def test_close_ends_the_running_job_at_once_not_after_its_forward():
    """The last event does not wait for the generation thread: each forward
    here takes 2 s, and the job's reader has its 503 well before the one under
    way ends."""
    import asyncio

    from mlx_dflash.server.job import Job

    engine = Engine(slow_provider(delay=2.0), EngineConfig()).start()
    try:

        async def run():
            job = engine.submit(Job(prompt=[5, 6, 7], max_tokens=100))
            ev = await job.next_event()  # the first token, from the prefill
            assert ev.finish_reason is None
            tic = time.perf_counter()
            engine.close()
            while ev.finish_reason is None:
                ev = await job.next_event()
            return ev, time.perf_counter() - tic

        ev, took = asyncio.run(run())
        assert (ev.finish_reason, ev.status) == ("error", 503), ev
        assert took < 1.0, f"the last event came {took:.1f} s after close"
    finally:
        engine.stop()


def test_sigterm_handler_closes_through_the_event_loop():
    """A signal can land while `submit` holds the engine's lock, on the same
    thread: the handler must not wait for the lock (it would wait forever).
    Here another thread holds it for as long as the handler would wait."""
    import asyncio

    import uvicorn

    from mlx_dflash.server.cli import Server

    engine = Engine(slow_provider(delay=0.0), EngineConfig()).start()
    try:

        held, release = threading.Event(), threading.Event()

        def hold():  # the lock taken, as by the interrupted submit
            with engine._lock:
                held.set()
                release.wait(5)

        async def run():
            server = Server(uvicorn.Config(lambda *a: None), engine)
            threading.Thread(target=hold).start()
            held.wait(5)
            tic = time.perf_counter()
            server.handle_exit(signal.SIGTERM, None)
            took = time.perf_counter() - tic
            release.set()
            await asyncio.sleep(0.05)
            return took

        took = asyncio.run(run())
        assert took < 0.5, f"the handler waited {took:.1f} s for the lock"
        assert engine.closing
    finally:
        engine.stop()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_sigterm_during_a_stream_exits_cleanly(tmp_path, path):
    model_dir = tmp_path / "model"
    save_tiny_model_dir("qwen3", model_dir)
    proc, url = serve_process(model_dir)
    try:
        # Greedy "go" runs the tiny model to its context limit (~4,000 tokens,
        # seconds): the stream is still running when the signal lands. (A
        # sampled reply can end at EOS first: that stream rightly has no error.)
        body = {**_chat("go", 100000, stream=True), "temperature": 0.0}
        if path == "/v1/messages":
            body["model"] = "claude-x"
        lines = []
        with httpx.stream("POST", url + path, json=body, timeout=30) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 20:
                    tic = time.perf_counter()
                    proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=10)
        took = time.perf_counter() - tic
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, proc.stderr.read().decode()
    assert took < 5.0, f"exit took {took:.1f} s"
    data = [json.loads(x[5:]) for x in lines if x.startswith("data:") and "[DONE]" not in x]
    assert "error" in data[-1], f"the stream ended before the signal: {data[-1]}"
    if path == "/v1/messages":
        assert [x for x in lines if x.startswith("event:")][-1] == "event: error"
        assert data[-1]["error"]["type"] == "overloaded_error"
    else:
        assert [x for x in lines if x][-1] == "data: [DONE]"
        assert data[-1]["error"]["code"] == "server_shutting_down"


def test_idle_keep_alive_connection_outlives_client_pools(tmp_path):
    """SDK clients (httpx) reuse a connection idle up to 5 s, uvicorn's own
    default: a request sent as the server closes its side was reset (a CI
    failure, anthropic.APIConnectionError). serve keeps idle connections
    open past that, so the same socket still answers after 6 s."""
    import http.client
    from urllib.parse import urlparse

    model_dir = tmp_path / "model"
    save_tiny_model_dir("qwen3", model_dir)
    proc, url = serve_process(model_dir)
    try:
        conn = http.client.HTTPConnection(urlparse(url).netloc, timeout=10)
        conn.request("GET", "/v1/models")
        assert conn.getresponse().read() and conn.sock is not None
        sock = conn.sock
        time.sleep(6)
        conn.request("GET", "/v1/models")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["data"][0]["id"] == "tiny"
        assert conn.sock is sock  # the same connection, not a reconnect
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
