"""Prompt suites shipped as package data (mlx_dflash/bench/suites/*.json).

Short suites hold chat messages. Long-context suites are built at run time:
an agent-style transcript in which the assistant reads real source files
(mlx_lm's and the Python standard library's, as installed here), cut with
the target's tokenizer to the suite's token length, then a final task.
"""

import json
import random
import sysconfig
from importlib import resources
from pathlib import Path
from typing import List, Optional, Tuple

SUITES = ("code", "math", "chat", "copy_edit", "long_8k", "long_16k")

_MLX_LM_FILES = (
    "generate.py",
    "models/cache.py",
    "models/llama.py",
    "sample_utils.py",
    "tokenizer_utils.py",
    "utils.py",
    "server.py",
)
_STDLIB_FILES = (
    "json/decoder.py",
    "json/encoder.py",
    "csv.py",
    "shlex.py",
    "textwrap.py",
    "configparser.py",
    "argparse.py",
)

SYSTEM = (
    "You are a coding agent working in a user's repository. Read files with the "
    "read_file tool, then answer precisely and cite file paths."
)


def load_suite(name: str) -> dict:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
    text = resources.files(__package__).joinpath("suites", f"{name}.json").read_text()
    return json.loads(text)


def source_files() -> List[Tuple[str, str]]:
    """(display path, text) of the transcript's source files, in a fixed order."""
    import mlx_lm

    roots = [
        ("mlx_lm", Path(mlx_lm.__file__).parent, _MLX_LM_FILES),
        ("stdlib", Path(sysconfig.get_paths()["stdlib"]), _STDLIB_FILES),
    ]
    out = []
    for label, root, names in roots:
        for name in names:
            p = root / name
            if p.is_file():
                out.append((f"{label}/{name}", p.read_text(errors="replace")))
    return out


def _encode(tokenizer, messages) -> List[int]:
    if getattr(tokenizer, "has_chat_template", False):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return list(tokenizer.encode("\n\n".join(m["content"] for m in messages)))


def agent_transcript(tokenizer, n_tokens: int, task: str) -> List[int]:
    """Prompt ids of about `n_tokens`: tool-call turns reading files, then `task`."""
    files = source_files()
    if not files:
        raise ValueError("no source files found for the long-context transcript")
    messages = [{"role": "system", "content": SYSTEM}]
    final = {"role": "user", "content": task}
    i = 0
    while True:
        path, text = files[i % len(files)]
        call = {"role": "assistant", "content": f'read_file(path="{path}")'}
        result = {
            "role": "user",
            "content": f'<tool_result path="{path}">\n{text}\n</tool_result>',
        }
        trial = messages + [call, result, final]
        if len(_encode(tokenizer, trial)) >= n_tokens:
            # Cut this file so the whole prompt lands at n_tokens (bisect on chars).
            lo, hi = 0, len(text)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                result["content"] = (
                    f'<tool_result path="{path}">\n{text[:mid]}\n</tool_result>'
                )
                if (
                    len(_encode(tokenizer, messages + [call, result, final]))
                    <= n_tokens
                ):
                    lo = mid
                else:
                    hi = mid - 1
            result["content"] = (
                f'<tool_result path="{path}">\n{text[:lo]}\n</tool_result>'
            )
            return _encode(tokenizer, messages + [call, result, final])
        messages += [call, result]
        i += 1


def suite_prompts(
    name: str,
    tokenizer=None,
    *,
    vocab_size: Optional[int] = None,
    limit: Optional[int] = None,
    synthetic_tokens: int = 128,
    seed: int = 0,
) -> List[Tuple[str, List[int]]]:
    """(prompt id, token ids) of a suite.

    Without a tokenizer (random-weight shape presets, whose outputs carry no
    meaning) prompts are seeded random ids: `synthetic_tokens` long for short
    suites, the suite's length for long-context ones.
    """
    suite = load_suite(name)
    if suite.get("builder") == "agent_transcript":
        n = suite["tokens"]
        if tokenizer is None:
            rng = random.Random(seed)
            return [(name, [rng.randrange(vocab_size) for _ in range(n)])]
        return [(name, agent_transcript(tokenizer, n, suite["task"]))]
    prompts = suite["prompts"][:limit] if limit else suite["prompts"]
    out = []
    for k, p in enumerate(prompts):
        if tokenizer is None:
            rng = random.Random(seed * 1000 + k)
            out.append(
                (p["id"], [rng.randrange(vocab_size) for _ in range(synthetic_tokens)])
            )
        else:
            out.append((p["id"], _encode(tokenizer, p["messages"])))
    return out
