"""`serve --max-batch N`: concurrent requests share the batched verify, and
each still returns its solo output (the one-row path's, helpers.expected),
on an attention model and a hybrid one (GatedDeltaNet, Hv != Hk)."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from helpers import LiveServer, chat_prompt, expected, random_provider

QUESTIONS = [
    "Count: one two three one two three one two",
    "Spell hello backwards, then forwards",
    "abc abc abc abc",
    "What is 2 + 2? Say it twice.",
]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def bsrv(request):
    s = LiveServer(random_provider(request.param), max_batch=4)
    # Record the batch's size each cycle, and slow each cycle a little, so the
    # requests below overlap however fast this machine is (outputs unchanged).
    batch, sizes = s.engine.batch, []
    real = batch.step

    def step():
        sizes.append(len(batch))
        time.sleep(0.005)
        return real()

    batch.step = step
    s.sizes = sizes
    yield s
    s.close()


def messages(q):
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": q},
    ]


def test_concurrent_requests_return_their_solo_outputs(bsrv):
    want = [
        expected(bsrv, chat_prompt(bsrv, messages(q)), 40 + 8 * i)
        for i, q in enumerate(QUESTIONS)
    ]
    bsrv.sizes.clear()
    gone = threading.Event()

    def ask(i):
        return bsrv.openai.chat.completions.create(
            model="tiny", messages=messages(QUESTIONS[i]), max_tokens=40 + 8 * i
        )

    def leave_early():
        # A fifth stream that disconnects after its first chunk.
        body = {
            "model": "tiny",
            "messages": messages("Tell me a long story"),
            "max_tokens": 400,
            "stream": True,
        }
        with httpx.stream("POST", bsrv.url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    break  # closes the connection mid-stream
        gone.set()

    with ThreadPoolExecutor(5) as pool:
        early = pool.submit(leave_early)
        replies = list(pool.map(ask, range(len(QUESTIONS))))
        early.result()
    for (tokens, text), r in zip(want, replies):
        assert r.choices[0].message.content == text
        assert r.usage.completion_tokens == len(tokens)
    assert max(bsrv.sizes) >= 2  # they were verified together
    deadline = time.time() + 20
    while "cancelled" not in httpx.get(bsrv.url + "/metrics").text:
        assert time.time() < deadline, "the disconnected stream was not cancelled"
        time.sleep(0.1)
    while bsrv.engine.batch.rows:
        assert time.time() < deadline, "a row stayed in the batch"
        time.sleep(0.05)
    # ... and the server keeps serving, still exactly.
    tokens, text = expected(bsrv, chat_prompt(bsrv, messages(QUESTIONS[0])), 12)
    r = bsrv.openai.chat.completions.create(
        model="tiny", messages=messages(QUESTIONS[0]), max_tokens=12
    )
    assert r.choices[0].message.content == text


def test_every_api_through_the_batch_answers_as_alone(bsrv):
    """Requests of the three APIs at once (OpenAI chat, an Anthropic stream,
    Responses: what Claude Code's side requests and Codex send) are batched
    and each answers exactly as the same request sent alone."""
    calls = [
        lambda: bsrv.openai.chat.completions.create(
            model="tiny", messages=messages(QUESTIONS[0]), max_tokens=30
        ).choices[0].message.content,
        lambda: _anthropic_stream(bsrv, QUESTIONS[1], 40),
        lambda: bsrv.openai.responses.create(
            model="tiny", input=QUESTIONS[2], max_output_tokens=24
        ).output_text,
        lambda: bsrv.anthropic.messages.create(
            model="tiny", max_tokens=16,
            messages=[{"role": "user", "content": QUESTIONS[3]}],
        ).content[0].text,
    ]
    alone = [call() for call in calls]
    bsrv.sizes.clear()
    with ThreadPoolExecutor(len(calls)) as pool:
        together = list(pool.map(lambda call: call(), calls))
    assert together == alone and all(alone)  # (non-empty replies)
    assert max(bsrv.sizes) >= 2  # they were verified together


def _anthropic_stream(srv, question, max_tokens):
    with srv.anthropic.messages.stream(
        model="tiny", max_tokens=max_tokens,
        messages=[{"role": "user", "content": question}],
    ) as stream:
        return stream.get_final_text()


def _metric(text, name):
    return float(next(l.split()[-1] for l in text.splitlines() if l.startswith(name + " ")))


def test_metrics_report_the_batch():
    """/metrics: the batch's size and waiting rows, each row's τ while it
    decodes, and every finished generation's τ in a histogram."""
    srv = LiveServer(random_provider("qwen3"), max_batch=2, fallback=None)
    try:
        text = httpx.get(srv.url + "/metrics").text
        assert "mlx_dflash_batch_size" in text and "mlx_dflash_rows_waiting" in text
        live = None
        with srv.openai.chat.completions.create(
            model="tiny", messages=messages(QUESTIONS[2]), max_tokens=200, stream=True
        ) as stream:
            for i, _ in enumerate(stream):
                if i == 10:  # cycles have run: the row's τ so far is on show
                    live = httpx.get(srv.url + "/metrics").text
        if live is not None:  # (a reply shorter than 10 chunks shows no live row)
            assert 'mlx_dflash_batch_row_tau{row="0"}' in live
        r = srv.openai.chat.completions.create(
            model="tiny", messages=messages(QUESTIONS[0]), max_tokens=50
        )
        tau = r.model_extra["mlx_dflash"]["spec"]["tau"]
        text = httpx.get(srv.url + "/metrics").text
        assert _metric(text, "mlx_dflash_tau_count") == 2
        assert _metric(text, "mlx_dflash_tau_sum") >= 1 + tau - 1e-3  # usage rounds τ
        assert 'mlx_dflash_batch_row_tau{row="0"}' not in text  # the batch is empty
    finally:
        srv.close()


def test_max_batch_flag_is_checked(capsys):
    from mlx_dflash.server.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--max-batch", "0"])
    assert e.value.code == 2
    assert "--max-batch must be >= 1" in capsys.readouterr().err
