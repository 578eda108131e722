"""Bad paths, files, options and input give one `error:` line; stats with
nothing to count are null."""

import io
import json
import shutil
import sys

import pytest

pytest.importorskip("fastapi")  # the HTTP stack (absent on the CUDA machine)
from models import save_tiny_model_dir

from mlx_dflash import generate, serve
from mlx_dflash.bench import report
from mlx_dflash.bench.runner import Arm, Case, run_case
from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.fallback import Fallback
from mlx_dflash.sampling import SamplingParams
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    save_tiny_model_dir("qwen3", root / "model")
    shutil.copytree(root / "model", root / "bad-json")
    (root / "bad-json" / "config.json").write_text('{"model_type": "qwen3",')
    (root / "bad-draft").mkdir()
    (root / "bad-draft" / "config.json").write_text("{oops")
    shutil.copytree(root / "model", root / "no-weights")
    for f in (root / "no-weights").glob("*.safetensors*"):
        f.unlink()
    (root / "notes.txt").write_text("not a checkpoint")
    (root / "fake.gguf").write_bytes(b"garbage")
    return root


def one_line_error(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err.strip()


MODEL, LOOKUP = ["--model", "{root}/model"], ["--draft", "lookup"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "/nonexistent/dir"], "--model /nonexistent/dir: no such file"),
        (["--model", "/nonexistent/dir", *LOOKUP], "--model /nonexistent/dir: no such"),
        (
            ["--model", "{root}/bad-json", *LOOKUP],
            "{root}/bad-json/config.json is not valid JSON: Expecting",
        ),
        (
            [*MODEL, "--draft", "{root}/bad-draft"],
            "{root}/bad-draft/config.json is not valid JSON: Expecting",
        ),
        (
            ["--model", "{root}/no-weights", *LOOKUP],
            "--model {root}/no-weights has no *.safetensors weights",
        ),
        (
            [*MODEL, "--draft", "{root}/notes.txt"],
            "--draft {root}/notes.txt is a file, not a checkpoint directory",
        ),
        (
            ["--model", "{root}/fake.gguf", *LOOKUP],
            "{root}/fake.gguf is not a readable GGUF file",
        ),
        ([*MODEL, *LOOKUP, "--block-size", "0"], "--block-size must be >= 1, got 0"),
        ([*MODEL, *LOOKUP, "--block-size", "-2"], "--block-size must be >= 1, got -2"),
        ([*MODEL, *LOOKUP, "--prompt-lookup", "2:1"], "--prompt-lookup '2:1': need 1 <= MIN"),
        ([*MODEL, *LOOKUP, "--prompt-lookup", "yes"], "--prompt-lookup 'yes': use on, off"),
    ],
    ids=[
        "missing-model",
        "missing-model-lookup",
        "model-config-json",
        "draft-config-json",
        "no-weights",
        "draft-is-file",
        "fake-gguf",
        "block-size-0",
        "block-size-negative",
        "prompt-lookup-order",
        "prompt-lookup-word",
    ],
)
def test_generate_one_line_errors(root, capsys, argv, message):
    argv = [a.format(root=root) for a in argv] + ["--prompt", "hi"]
    line = one_line_error(generate.main, argv, capsys)
    assert line.startswith("error: " + message.format(root=root)), line


@pytest.mark.parametrize(
    "argv, message",
    [
        # A model that fails to load: were the flag accepted, no server starts.
        (["--model", "{root}/fake.gguf", *LOOKUP, "--block-size", "0"], "--block-size"),
        (["--model", "./missing"], "--model ./missing: no such file or directory"),
    ],
    ids=["block-size-0", "missing-model"],
)
def test_serve_one_line_errors(root, capsys, argv, message):
    argv = [a.format(root=root) for a in argv]
    assert one_line_error(serve.main, argv, capsys).startswith("error: " + message)


def test_non_utf8_stdin_prompt(root, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9")))
    argv = ["--model", str(root / "model"), *LOOKUP, "--prompt", "-"]
    assert one_line_error(generate.main, argv, capsys) == (
        "error: the prompt on stdin is not valid UTF-8 (byte 0xe9 at offset 3)"
    )


def test_stats_with_nothing_drafted_are_null():
    st = SpecStats(4)
    d = st.as_dict()
    assert d["tau"] is None and d["acceptance_rate"] is None
    assert d["per_position_acceptance"] == [None, None, None]
    st.record(drafted=1, accepted=1, emitted=2)
    d = st.as_dict()
    assert (d["tau"], d["acceptance_rate"]) == (2.0, 1.0)
    assert d["per_position_acceptance"] == [1.0, None, None]


def test_bench_report_shows_null_stats_as_na(tmp_path):
    # Lookup on a prompt without repeats: the fallback never speculates.
    target = Target(save_tiny_model_dir("qwen3", tmp_path / "m"))
    arm = Arm("lookup", lambda ref: PromptLookupDrafter(), 8, fallback=Fallback())
    case = run_case(
        target,
        Case("chat", "tiny", list(range(3, 19)), 16, SamplingParams()),
        [arm],
        repeats=1,
        cooldown=0.0,
    )
    spec = case["arms"]["lookup"]["spec"]
    assert spec["cycles"] == 0 and spec["tau"] is None
    results = {"title": "t", "settings": {}, "environment": {}, "cases": [case]}
    _, md, _ = report.write(results, tmp_path / "r", "mlx-dflash bench")
    assert "n/a" in md.read_text() and "n/a" in report.table(results)


def test_generation_tokens_count_the_token_list(root, capsys, tmp_path):
    def run(model, *extra):
        argv = ["--model", str(model), *LOOKUP, "--prompt", "hi", "-m", "8", *extra]
        generate.main(argv)
        return capsys.readouterr()

    tokens = json.loads(run(root / "model", "--json").out)["tokens"]
    # Make the first token not seen before the EOS, so generation stops there.
    i = next(i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i])
    model = shutil.copytree(root / "model", tmp_path / "eos")
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    word = next(w for w, t in vocab.items() if t == tokens[i])
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps(dict(cfg, eos_token=word)))

    result = json.loads(run(model, "--json").out)
    assert result["finish_reason"] == "stop" and result["tokens"] == tokens[:i]
    assert result["generation_tokens"] == i
    assert f"generation: {i} tokens" in run(model).err
