import os
import sys
from pathlib import Path

import pytest

# Exactness tests compare algorithms, not hardware precision: MLX runs float32 matmuls
# as TF32 on CUDA (and M5) by default, where two equivalent formulations of different
# shapes (padded vs exact keys) differ by ~1e-2. Read by MLX on first use.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

# Tests import their shared helpers as `models` (tiny models) and `helpers`.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def srv():
    """A live server on a random tiny qwen3 with prompt lookup (one per test module)."""
    from helpers import LiveServer, random_provider

    s = LiveServer(random_provider())
    yield s
    s.close()


@pytest.fixture(scope="module")
def tool_srv():
    """A live server whose scripted target thinks, answers and calls get_weather."""
    from helpers import LiveServer, tool_provider

    s = LiveServer(tool_provider())
    yield s
    s.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An mlx_lm directory of a tiny qwen3 with a word-level tokenizer."""
    from models import save_tiny_model_dir

    path = tmp_path_factory.mktemp("tiny-qwen3")
    save_tiny_model_dir("qwen3", path)
    return path


@pytest.fixture
def draft_dir(tmp_path):
    """A z-lab-format DFlash checkpoint for models.py's tiny targets."""
    from helpers import write, zlab_config, zlab_weights

    return str(write(tmp_path / "draft", zlab_config(), zlab_weights()))


@pytest.fixture(scope="module")
def servers():
    """One scripted server per Qwen tool format (helpers.CHAINS)."""
    from helpers import CHAINS, qwen_tokenizer, scripted_server
    from mlx_lm.tool_parsers import json_tools, qwen3_coder

    out = {}
    for fmt, chain in CHAINS.items():
        words = [w for w in chain if w not in ("<think>", "</think>", "<tool_call>")]
        if fmt == "json":  # Qwen3: the model opens the think block itself
            tok = qwen_tokenizer(words, json_tools, opens_think=False)
        else:  # Qwen3.5 / Qwen3-Coder: the prompt opens it
            tok = qwen_tokenizer(words, qwen3_coder, opens_think=True)
        out[fmt] = scripted_server(chain, tok)
    yield out
    for s in out.values():
        s.close()
