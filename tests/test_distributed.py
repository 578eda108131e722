"""Two ranks on this machine (`mlx.launch -n 2 --backend ring`, CPU) against one process.

The target is split by mlx_lm's tensor-parallel `shard` (tiny llama: tied
head, KV heads split; tiny qwen3_5: hybrid with Hv != Hk, GatedDeltaNet heads
split, untied head split by vocabulary). Each rank runs tests/distributed_ranks.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import write, zlab_config, zlab_weights
from mlx_lm.generate import generate_step as stock_generate_step
from models import save_tiny_model_dir

import distributed_ranks as ranks
from mlx_dflash.decode import generate_step
from mlx_dflash.drafters import PromptLookupDrafter
from mlx_dflash.load import load_pair

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = Path(sys.executable).parent / "mlx.launch"
FAMILIES = ["llama", "qwen3_5"]


def launch(*cmd, timeout=240):
    """`mlx.launch -n 2 --backend ring -- CMD` with this checkout importable; on
    a timeout its ranks are killed too (killing the launcher alone orphans them)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [str(LAUNCH), "-n", "2", "--backend", "ring", "--", *map(str, cmd)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_tree(proc):
    for p in descendants(proc.pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny target directories and a z-lab DFlash checkpoint the ranks load."""
    root = tmp_path_factory.mktemp("dist")
    for family in FAMILIES:
        save_tiny_model_dir(family, root / family)
    write(root / "draft", zlab_config(), zlab_weights())
    return root


@pytest.fixture(scope="module")
def ranked(dirs):
    """What each rank of one 2-rank launch reported, per family."""
    script = Path(__file__).with_name("distributed_ranks.py")
    cmd = [sys.executable, script, dirs / "draft", dirs, *(dirs / f for f in FAMILIES)]
    done = launch(*cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    return {
        f: [json.loads((dirs / f"{f}.tensor.rank{r}.json").read_text()) for r in (0, 1)]
        for f in FAMILIES
    }


def one_process(dirs, family):
    """The same runs in this process, unsharded: stock greedy and our speculative runs."""
    pair = load_pair(str(dirs / family), str(dirs / "draft"))
    prompt = mx.array(ranks.PROMPT)
    stock = [t for t, _ in stock_generate_step(prompt, pair.target.model, max_tokens=ranks.N)]
    out = {"stock": stock}
    for name, drafter in (("dflash", pair.drafter), ("lookup", PromptLookupDrafter())):
        steps = generate_step(
            pair.target,
            ranks.PROMPT,
            drafter,
            max_tokens=ranks.N,
            block_size=8,
            sampling=ranks.SAMPLING,
        )
        out[f"{name}/sampled"] = [t for t, _ in steps]
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_equal_one_process(dirs, ranked, family):
    ref = one_process(dirs, family)
    for r in ranked[family]:
        assert r["world"] == {"world_size": 2, "backend": "ring", "mode": "tensor"}
        # Each rank holds its own half of the heads (tiny models: 2 KV heads,
        # qwen3_5's GatedDeltaNet 4 value heads).
        assert r["kv_heads"] and set(r["kv_heads"]) == {1}
        assert r["delta_heads"] == ([2, 2, 2] if family == "qwen3_5" else [])
        assert r["stock"] == ref["stock"]  # sharding itself changes no token
        for name in ("dflash", "lookup", "oracle"):
            run = r[f"{name}/greedy"]
            assert run["tokens"] == ref["stock"], name
            assert run["cache_diff"] <= 1e-5, name
        for name in ("dflash", "lookup"):
            run = r[f"{name}/sampled"]
            assert run["tokens"] == ref[f"{name}/sampled"], name
            assert run["cache_diff"] <= 1e-5, name


PROMPT_TEXT = "hello world"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def single_json(dirs):
    """`mlx-dflash generate --json` in one process: the tokens to match."""
    from helpers import run_cli

    done = run_cli(
        *map(str, [
            "generate", "--model", dirs / "qwen3_5", "--draft", dirs / "draft",
            "--prompt", PROMPT_TEXT, "--max-tokens", MAX_TOKENS, "--json",
        ])
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_generate_cli_under_the_launcher(dirs, single_json):
    """Rank 0 alone prints: one JSON object, the one-process tokens, world_size 2."""
    done = launch(
        sys.executable, "-m", "mlx_dflash.cli", "generate",
        "--model", dirs / "qwen3_5", "--draft", dirs / "draft",
        "--prompt", PROMPT_TEXT, "--max-tokens", MAX_TOKENS, "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["distributed"] == {"world_size": 2, "backend": "ring", "mode": "tensor"}
    assert single_json["distributed"]["world_size"] == 1
    assert result["tokens"] == single_json["tokens"] and result["text"] == single_json["text"]
    assert result["stats"]["cycles"] > 0  # it speculated (no fallback across ranks)


def descendants(pid: int):
    """Process ids under `pid` (from /proc)."""
    parents = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parents[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, par in parents.items() if par == parent]
        out += kids
        todo += kids
    return out


def rank_of(pid: int):
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"MLX_RANK="):
            return int(e[9:])
    return None


@pytest.mark.slow
def test_serve_under_the_launcher(dirs, single_json):
    """Rank 0 answers the OpenAI SDK (the one-process text, streaming and not);
    killing rank 1 then ends every rank, no hang."""
    import httpx
    from helpers import free_port
    from openai import OpenAI

    port = free_port()
    cmd = [
        sys.executable, "-m", "mlx_dflash.serve", "--model", dirs / "qwen3_5",
        "--draft", dirs / "draft", "--port", port, "--log-level", "warning",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [str(LAUNCH), "-n", "2", "--backend", "ring", "--", *map(str, cmd)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert card["mlx_dflash"]["distributed"] == {
            "world_size": 2,
            "backend": "ring",
            "mode": "tensor",
        }
        client = OpenAI(base_url=url + "/v1", api_key="none")
        ask = dict(
            model="default",
            messages=[{"role": "user", "content": PROMPT_TEXT}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        reply = client.chat.completions.create(**ask)
        assert reply.choices[0].message.content == single_json["text"]
        assert reply.usage.completion_tokens == len(single_json["tokens"]) + 1  # + EOS
        chunks = client.chat.completions.create(**ask, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == single_json["text"]
        # Seeded sampling answers the same twice (one key shared by the ranks).
        sampled = [
            client.chat.completions.create(**dict(ask, temperature=1.0, seed=5))
            .choices[0]
            .message.content
            for _ in range(2)
        ]
        assert sampled[0] == sampled[1]

        ranks_alive = descendants(proc.pid)
        followers = [p for p in ranks_alive if rank_of(p) == 1]
        assert followers, "rank 1 not found"
        tic = time.time()
        for p in followers:
            os.kill(p, signal.SIGKILL)
        proc.wait(timeout=60)  # the launcher ends rank 0 too (its exit code is 0)
        left = [p for p in ranks_alive if Path(f"/proc/{p}").exists()]
        assert not left and time.time() - tic < 60
        assert "rank 1" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            kill_tree(proc)


@pytest.mark.slow
def test_bench_under_the_launcher(dirs, tmp_path):
    """Rank 0 alone writes the report; the arms match stock token for token."""
    out = tmp_path / "bench"
    done = launch(
        sys.executable, "-m", "mlx_dflash.cli", "bench", "--model", dirs / "qwen3_5",
        "--draft", f"lookup,{dirs / 'draft'}", "--suites", "code",
        "--prompts-per-suite", 1, "--max-tokens", 12, "--repeats", 1, "--cooldown", 0,
        "--no-png", "--no-profile", "--out", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1
    results = json.loads(out.with_suffix(".json").read_text())
    assert results["settings"]["distributed"]["world_size"] == 2
    for case in results["cases"]:
        for arm in case["arms"].values():
            assert arm["token_match"]["equal_pct"] == 100.0


@pytest.mark.slow
def test_pipeline_two_ranks_equal_one_process(dirs):
    """--pipeline: qwen3_5's layers split in two ranges (mlx_lm's `pipeline`); the
    drafter's captured layers 1 and 2 live on different ranks."""
    script = Path(__file__).with_name("distributed_ranks.py")
    done = launch(sys.executable, script, "--pipeline", dirs / "draft", dirs, dirs / "qwen3_5")
    assert done.returncode == 0, done.stderr[-3000:]
    ranked = [
        json.loads((dirs / f"qwen3_5.pipeline.rank{r}.json").read_text()) for r in (0, 1)
    ]
    ref = one_process(dirs, "qwen3_5")
    # mlx_lm gives rank 0 the last layers: 2 (GatedDeltaNet) and 3 (attention).
    assert [(r["kv_heads"], r["delta_heads"]) for r in ranked] == [([2], [4]), ([], [4, 4])]
    for r in ranked:
        assert r["world"] == {"world_size": 2, "backend": "ring", "mode": "pipeline"}
        assert r["stock"] == ref["stock"]
        for name in ("dflash", "lookup", "oracle"):
            assert r[f"{name}/greedy"]["tokens"] == ref["stock"], name
            assert r[f"{name}/greedy"]["cache_diff"] <= 1e-5, name
        for name in ("dflash", "lookup"):
            assert r[f"{name}/sampled"]["tokens"] == ref[f"{name}/sampled"], name
            assert r[f"{name}/sampled"]["cache_diff"] <= 1e-5, name
