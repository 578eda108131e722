"""Bounded load test: 50 requests from 8 concurrent clients against `mlx-dflash serve`.

The server is the real CLI in its own process (a tiny qwen3 model directory
from tests/models.py, prompt lookup drafter, block 4), so the memory we read
is the server's alone: `process_resident_memory_bytes` and MLX's active
memory, both from its /metrics. Clients are the official openai and anthropic
SDKs plus raw httpx for bodies the SDKs won't send.

Phases: (1) references: each distinct well-formed request once, alone;
(2) warm-up: the whole 50-request mix, concurrently, which fills MLX's buffer
pool, the prompt cache (to its byte budget) and Python's allocator; then we
read memory; (3) the test: the same mix again; we read memory again. Every
well-formed request must equal its reference (text, token count, and for
OpenAI requests the tokens and their log-probabilities), every malformed one
gets its 4xx in its API's error format, every disconnect is recorded as a
cancelled generation, and memory must return to within 10% of phase (2)'s.

Run alone for the numbers in bench/results/server_load.md:
    cd tests && python test_server_load.py
"""

import json
import random
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
anthropic = pytest.importorskip("anthropic")  # the SDKs, as absent there
openai = pytest.importorskip("openai")  # the SDKs, as absent there
from helpers import serve_process
from models import save_tiny_model_dir

N_CLIENTS = 8
# Prompts whose greedy answer runs past 1500 tokens: a disconnect must find
# the generation still running (load_test checks the first 128 tokens).
LONG_PROMPTS = (0, 1, 4)
WORDS = "hello world def return a b c 1 2 3 x y z".split()
PROMPT_CACHE_BYTES = 3_000_000  # ~11 entries of 256 KiB: eviction is exercised
TOLERANCE = 0.10


@dataclass
class Req:
    kind: str
    prompt: int = 0  # index into the prompt texts
    max_tokens: int = 24
    sampled: bool = False
    bad: str = ""  # for kind == "malformed": which mistake


def workload(seed: int = 0):
    """The 50-request mix, in a fixed shuffled order."""
    reqs = []
    for i in range(8):
        reqs.append(Req("oa_chat", prompt=i % 6, max_tokens=16 + 4 * (i % 3)))
    for i in range(8):
        reqs.append(Req("oa_chat_stream", prompt=(i + 2) % 6, max_tokens=24))
    for i in range(4):
        reqs.append(Req("oa_completion", prompt=6 + i % 3, max_tokens=20))
    for i in range(3):
        reqs.append(Req("oa_completion_stream", prompt=6 + i % 3, max_tokens=20))
    for i in range(6):
        reqs.append(Req("an_messages", prompt=i % 6, max_tokens=16 + 4 * (i % 3)))
    for i in range(5):
        reqs.append(Req("an_stream", prompt=(i + 1) % 6, max_tokens=24))
    for i in range(3):
        reqs.append(Req("oa_chat", prompt=i, max_tokens=24, sampled=True))
    for i in LONG_PROMPTS:
        reqs.append(Req("oa_disconnect", prompt=i, max_tokens=1500))
        reqs.append(Req("an_disconnect", prompt=i, max_tokens=1500))
    for bad in (
        "invalid_json",
        "max_tokens_0",
        "client_template",
        "unknown_model",
        "empty_messages",
        "too_long",
        "wrong_type",
    ):
        reqs.append(Req("malformed", bad=bad))
    assert len(reqs) == 50
    random.Random(seed).shuffle(reqs)
    return reqs


def prompt_texts(seed: int = 0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(12 + 3 * i)) for i in range(9)]


class Server:
    """`python -m mlx_dflash.serve` on loopback, in its own process."""

    def __init__(self, model_dir: Path):
        self.proc, self.url = serve_process(
            model_dir, "--block-size", "4", "--prompt-cache-bytes", str(PROMPT_CACHE_BYTES)
        )
        limits = httpx.Limits(max_connections=2 * N_CLIENTS)
        self.openai = openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=60,
        )
        self.anthropic = anthropic.Anthropic(
            base_url=self.url,
            api_key="unused",
            max_retries=0,
            timeout=60,
        )
        self.http = httpx.Client(base_url=self.url, timeout=60, limits=limits)

    def metrics(self) -> dict:
        """Prometheus text -> {"name{labels}": value}."""
        out = {}
        for line in self.http.get("/metrics").text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def cancelled(self) -> int:
        pat = re.compile(r'^mlx_dflash_generations_total\{.*finish_reason="cancelled"')
        return int(sum(v for k, v in self.metrics().items() if pat.match(k)))

    def idle(self):
        """Wait until no generation is queued or running (all requests answered)."""
        deadline = time.time() + 30
        while self.metrics().get("mlx_dflash_queue_depth", 0) > 0:
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # the last job's bookkeeping and the idle clear_cache

    def memory(self) -> dict:
        self.idle()
        m = self.metrics()
        return {
            "rss": m.get("process_resident_memory_bytes"),
            "active": m["mlx_dflash_mlx_active_memory_bytes"],
            "mlx_cache": m["mlx_dflash_mlx_cache_memory_bytes"],
            "prompt_cache": m["mlx_dflash_prompt_cache_bytes"],
        }

    def close(self):
        for c in (self.openai, self.anthropic):
            c.close()
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- one request of each kind -------------------------------------------------------


@dataclass
class Result:
    text: str
    n_tokens: int
    finish: str
    tokens: list = field(default_factory=list)  # [(token text, logprob)], OpenAI only


def _sampling(req: Req) -> dict:
    return {"temperature": 0.8, "seed": 1234} if req.sampled else {"temperature": 0}


def _lp(content):
    return [(e.token, e.logprob) for e in content or []]


def reference(srv: Server, texts, req: Req) -> Result:
    """The single-request result: one non-streaming OpenAI request, alone."""
    if req.kind.startswith("oa_completion"):
        r = srv.openai.completions.create(
            model="tiny",
            prompt=texts[req.prompt],
            max_tokens=req.max_tokens,
            logprobs=0,
            temperature=0,
        )
        c = r.choices[0]
        tokens = list(zip(c.logprobs.tokens, c.logprobs.token_logprobs))
        return Result(c.text, r.usage.completion_tokens, c.finish_reason, tokens)
    r = srv.openai.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": texts[req.prompt]}],
        max_tokens=req.max_tokens,
        logprobs=True,
        **_sampling(req),
    )
    c = r.choices[0]
    return Result(
        c.message.content,
        r.usage.completion_tokens,
        c.finish_reason,
        _lp(c.logprobs.content),
    )


_AN_FINISH = {"end_turn": "stop", "max_tokens": "length"}


def run(srv: Server, texts, req: Req) -> Result:
    messages = [{"role": "user", "content": texts[req.prompt]}]
    oa = dict(model="tiny", messages=messages, max_tokens=req.max_tokens)
    an = dict(model="claude-local", messages=messages, max_tokens=req.max_tokens)
    if req.kind == "oa_chat":
        r = srv.openai.chat.completions.create(**oa, logprobs=True, **_sampling(req))
        c = r.choices[0]
        return Result(
            c.message.content,
            r.usage.completion_tokens,
            c.finish_reason,
            _lp(c.logprobs.content),
        )
    if req.kind == "oa_chat_stream":
        text, tokens, finish, n = [], [], None, 0
        for ch in srv.openai.chat.completions.create(
            **oa,
            logprobs=True,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if ch.usage:
                n = ch.usage.completion_tokens
            if not ch.choices:
                continue
            text.append(ch.choices[0].delta.content or "")
            tokens += _lp(ch.choices[0].logprobs and ch.choices[0].logprobs.content)
            finish = ch.choices[0].finish_reason or finish
        return Result("".join(text), n, finish, tokens)
    if req.kind.startswith("oa_completion"):
        kw = dict(
            model="tiny",
            prompt=texts[req.prompt],
            max_tokens=req.max_tokens,
            logprobs=0,
            temperature=0,
        )
        if req.kind == "oa_completion":
            r = srv.openai.completions.create(**kw)
            c = r.choices[0]
            tokens = list(zip(c.logprobs.tokens, c.logprobs.token_logprobs))
            return Result(c.text, r.usage.completion_tokens, c.finish_reason, tokens)
        text, tokens, finish, n = [], [], None, 0
        for ch in srv.openai.completions.create(
            **kw, stream=True, stream_options={"include_usage": True}
        ):
            if ch.usage:
                n = ch.usage.completion_tokens
            if not ch.choices:
                continue
            c = ch.choices[0]
            text.append(c.text)
            tokens += list(zip(c.logprobs.tokens, c.logprobs.token_logprobs))
            finish = c.finish_reason or finish
        return Result("".join(text), n, finish, tokens)
    if req.kind == "an_messages":
        m = srv.anthropic.messages.create(**an, extra_body={"temperature": 0})
        text = "".join(b.text for b in m.content if b.type == "text")
        return Result(text, m.usage.output_tokens, _AN_FINISH[m.stop_reason])
    if req.kind == "an_stream":
        with srv.anthropic.messages.stream(**an, extra_body={"temperature": 0}) as s:
            text = "".join(s.text_stream)
            m = s.get_final_message()
        return Result(text, m.usage.output_tokens, _AN_FINISH[m.stop_reason])
    if req.kind == "oa_disconnect":
        stream = srv.openai.chat.completions.create(**oa, temperature=0, stream=True)
        for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                break
        stream.close()  # mid-generation: 1500 tokens were asked for
        return Result("", 0, "disconnected")
    if req.kind == "an_disconnect":
        with srv.anthropic.messages.stream(**an, extra_body={"temperature": 0}) as s:
            for event in s:
                if event.type == "content_block_delta":
                    break
        return Result("", 0, "disconnected")
    assert req.kind == "malformed"
    return Result("", 0, malformed(srv, req.bad))


def malformed(srv: Server, bad: str) -> str:
    """Send one bad request; check its status and error shape; return 'rejected'."""
    msgs = [{"role": "user", "content": "hello"}]
    if bad in ("invalid_json", "wrong_type"):
        body = (
            "{not json"
            if bad == "invalid_json"
            else json.dumps({"model": "tiny", "messages": "hello", "max_tokens": 4})
        )
        r = srv.http.post(
            "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        return "rejected"
    calls = {
        "max_tokens_0": (
            anthropic.BadRequestError,
            lambda: srv.anthropic.messages.create(
                model="claude-local", max_tokens=0, messages=msgs
            ),
        ),
        "client_template": (
            openai.BadRequestError,
            lambda: srv.openai.chat.completions.create(
                model="tiny",
                messages=msgs,
                max_tokens=4,
                extra_body={"chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
            ),
        ),
        "unknown_model": (
            anthropic.NotFoundError,
            lambda: srv.anthropic.messages.create(
                model="gpt-nope", max_tokens=4, messages=msgs
            ),
        ),
        "empty_messages": (
            openai.BadRequestError,
            lambda: srv.openai.chat.completions.create(
                model="tiny", messages=[], max_tokens=4
            ),
        ),
        "too_long": (
            openai.BadRequestError,
            lambda: srv.openai.completions.create(
                model="tiny", prompt="hello " * 5000, max_tokens=4
            ),
        ),
    }
    error, call = calls[bad]
    with pytest.raises(error) as e:
        call()
    assert e.value.status_code in (400, 404) and e.value.body
    return "rejected"


def check(got: Result, want: Result, req: Req):
    if req.kind == "malformed":
        assert got.finish == "rejected"
        return
    if req.kind.endswith("disconnect"):
        return
    where = f"{req} got {got} want {want}"
    assert got.text == want.text, where
    assert got.n_tokens == want.n_tokens and got.finish == want.finish, where
    if req.kind.startswith("oa_"):
        assert [t for t, _ in got.tokens] == [t for t, _ in want.tokens], where
        for (_, a), (_, b) in zip(got.tokens, want.tokens):
            assert abs(a - b) < 1e-4, where


def phase(srv: Server, texts, reqs, refs) -> dict:
    """All of `reqs` from N_CLIENTS threads; every result checked. Returns timings."""
    cancelled_before = srv.cancelled()
    tic = time.perf_counter()

    def one(req):
        t = time.perf_counter()
        got = run(srv, texts, req)
        check(got, refs.get(_key(req)), req)
        return req.kind, time.perf_counter() - t

    with ThreadPoolExecutor(N_CLIENTS) as pool:
        done = list(pool.map(one, reqs))
    wall = time.perf_counter() - tic
    disconnects = sum(r.kind.endswith("disconnect") for r in reqs)
    deadline = time.time() + 30
    while srv.cancelled() - cancelled_before < disconnects:
        gens = {k: v for k, v in srv.metrics().items() if "generations_total" in k}
        assert time.time() < deadline, (
            f"{disconnects} disconnects, {srv.cancelled() - cancelled_before} "
            f"cancelled: {gens}"
        )
        time.sleep(0.05)
    assert srv.cancelled() - cancelled_before == disconnects
    lat = sorted(t for _, t in done)
    return {
        "wall_s": wall,
        "p50_s": lat[len(lat) // 2],
        "max_s": lat[-1],
        "cancelled": disconnects,
    }


def _key(req: Req):
    chat = not req.kind.startswith("oa_completion")
    return (chat, req.prompt, req.max_tokens, req.sampled)


def load_test(model_dir: Path) -> dict:
    texts, reqs = prompt_texts(), workload()
    srv = Server(model_dir)
    try:
        tic = time.perf_counter()
        refs = {}
        for req in reqs:
            if req.kind == "malformed" or req.kind.endswith("disconnect"):
                continue
            if _key(req) not in refs:
                refs[_key(req)] = reference(srv, texts, req)
        for i in LONG_PROMPTS:
            long = reference(srv, texts, Req("oa_chat", prompt=i, max_tokens=128))
            assert long.finish == "length", f"prompt {i} ends early; pick another"
        ref_s = time.perf_counter() - tic
        warm = phase(srv, texts, reqs, refs)
        before = srv.memory()
        test = phase(srv, texts, reqs, refs)
        after = srv.memory()
        assert srv.proc.poll() is None and srv.http.get("/health").status_code == 200
        return {
            "references": len(refs),
            "reference_s": ref_s,
            "warmup": warm,
            "test": test,
            "before": before,
            "after": after,
        }
    finally:
        srv.close()


def within(before, after) -> bool:
    return abs(after - before) <= TOLERANCE * before


@pytest.mark.slow
def test_load(tmp_path):
    save_tiny_model_dir("qwen3", tmp_path / "model")
    out = load_test(tmp_path / "model")
    b, a = out["before"], out["after"]
    assert within(b["active"], a["active"]), out
    if b["rss"] is not None:  # process_resident_memory_bytes: Linux only
        assert within(b["rss"], a["rss"]), out
    assert a["prompt_cache"] <= PROMPT_CACHE_BYTES


def main():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        save_tiny_model_dir("qwen3", Path(d) / "model")
        tic = time.perf_counter()
        out = load_test(Path(d) / "model")
        total = time.perf_counter() - tic
    b, a = out["before"], out["after"]
    print(f"references: {out['references']} requests alone, {out['reference_s']:.1f} s")
    print("| phase | requests | clients | wall s | p50 s | max s | cancelled |")
    print("|---|---|---|---|---|---|---|")
    for name in ("warmup", "test"):
        p = out[name]
        print(
            f"| {name} | 50 | {N_CLIENTS} | {p['wall_s']:.1f} | {p['p50_s']:.2f} "
            f"| {p['max_s']:.2f} | {p['cancelled']} |"
        )
    print()
    print("| memory | after warm-up | after test | change |")
    print("|---|---|---|---|")
    for k in ("rss", "active", "mlx_cache", "prompt_cache"):
        if b[k] is None:
            continue
        ch = (a[k] - b[k]) / b[k] * 100 if b[k] else 0.0
        print(f"| {k} | {b[k] / 2**20:.2f} MiB | {a[k] / 2**20:.2f} MiB | {ch:+.1f}% |")
    print(f"\ntotal {total:.1f} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
