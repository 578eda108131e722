"""Long agent-style transcripts built from this machine's Python standard library.

A transcript is what a coding agent's model sees many turns into a session: a
system prompt with tool schemas, earlier turns in which the assistant called a
file-reading tool and got real source files back (stdlib modules), and a last
user request about that code. `transcript` builds one of about `n_tokens`
tokens, deterministically from a seed. Training and evaluation never share a
source file (split by a hash of the file's path), a harness (preamble and
tools) or a request template: the eval transcripts measure how the drafter
holds up at a context length, not how well it remembers a file.
"""

import ast
import bisect
import hashlib
import itertools
import json
import random
import sysconfig
import weakref
from functools import lru_cache
from pathlib import Path
from typing import List, Sequence

EVAL_FILE_SHARE = 0.25  # share of stdlib files (by path hash) kept for evaluation
_SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo"}

TOOL_FORMAT = (
    "To use a tool, answer with <tool_call>{{\"name\": NAME, \"arguments\": "
    "{{...}}}}</tool_call> and nothing else. Tool results come back in a "
    "message from the tool."
)


def _tool(name, description, **params):
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {k: {"type": t} for k, t in params.items()},
            "required": list(params)[:1],
        },
    }


# Two harnesses for training, a third for evaluation (their own words and tools).
HARNESSES = {
    "train": [
        (
            "You are an expert software engineer working in a terminal on the "
            "user's project. Read code before changing it, keep edits minimal and "
            "explain your reasoning briefly.",
            [
                _tool("read_file", "Read a file from disk.", path="string"),
                _tool("write_file", "Write text to a file.", path="string", text="string"),
                _tool("run", "Run a shell command.", command="string"),
                _tool("search", "Search the code base.", query="string"),
            ],
        ),
        (
            "You are Dev, an autonomous coding agent. You can inspect the "
            "repository with tools. Answer in Markdown.",
            [
                _tool("cat", "Print a file.", file="string"),
                _tool("ls", "List a directory.", dir="string"),
                _tool("edit", "Replace text in a file.", file="string", old="string", new="string"),
                _tool("bash", "Execute bash.", script="string"),
            ],
        ),
    ],
    "eval": [
        (
            "You help a developer with their codebase from inside their editor. "
            "Use the tools to look at files; be concise and precise.",
            [
                _tool("view", "Show the contents of a source file.", filename="string"),
                _tool("find_symbol", "Locate a class or function.", symbol="string"),
                _tool("shell", "Run a command in the project root.", cmd="string"),
            ],
        )
    ],
}

EARLIER_ASKS = {
    "train": [
        "Take a look at {path}.",
        "Can you read {path}? I want to understand it before we change anything.",
        "Open {path} too.",
        "Now check {path}.",
    ],
    "eval": [
        "Please view {path}.",
        "Let's also look at {path}.",
    ],
}

NOTES = {
    "train": [
        "I've read `{path}`. It defines {names}.",
        "Done: `{path}` contains {names}.",
    ],
    "eval": ["`{path}` shows {names}."],
}

FINAL_ASKS = {
    "train": [
        "Add type hints to `{name}` in {path} and show the updated function.",
        "Explain what `{name}` in {path} does, step by step.",
        "Write pytest tests for `{name}` from {path}.",
        "Is there any bug or edge case in `{name}` ({path})? Suggest a fix.",
        "Refactor `{name}` in {path} to be easier to read. Show the full new version.",
        "Write a docstring for `{name}` in {path}.",
        "Summarize the files we've looked at so far in a few bullet points.",
        "How would I use `{name}` from {path}? Give a short example.",
    ],
    "eval": [
        "What does `{name}` in {path} return, and when can it raise?",
        "Rewrite `{name}` from {path} with clearer variable names, same behaviour.",
        "Give me two unit tests for `{name}` ({path}) using unittest.",
        "Could `{name}` in {path} be made faster? Explain briefly.",
    ],
}


def _split_of(rel: str) -> str:
    h = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16)
    return "eval" if h / 0xFFFFFFFF < EVAL_FILE_SHARE else "train"


@lru_cache(maxsize=None)
def stdlib_files(split: str) -> List[str]:
    """Relative paths of the stdlib's .py files (2-80 kB) in `split`, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if _SKIP_DIRS & set(rel.split("/")[:-1]) or not 2_000 <= p.stat().st_size <= 80_000:
            continue
        if _split_of(rel) == split:
            out.append(rel)
    return out


def _read(rel: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / rel).read_text(errors="replace")


# Keyed by the tokenizer object itself, weakly: an id() key outlives its object and is
# reused by the next one made at that address, which would get another vocabulary's counts.
_LINE_TOKENS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _line_tokens(tokenizer, rel: str) -> List[int]:
    """Cumulative token counts of a file's lines (each line + its newline),
    once per file and tokenizer: an estimate, corrected at the end."""
    per_file = _LINE_TOKENS.setdefault(tokenizer, {})
    if rel not in per_file:
        lines = [line + "\n" for line in _read(rel).split("\n")]
        # One batched call of the fast tokenizer's backend where there is one.
        backend = getattr(getattr(tokenizer, "_tokenizer", None), "backend_tokenizer", None)
        if backend is not None:
            enc = backend.encode_batch(lines, add_special_tokens=False)
            sizes = [len(e.ids) for e in enc]
        else:
            sizes = [len(tokenizer.encode(line)) for line in lines]
        per_file[rel] = [0] + list(itertools.accumulate(sizes))
    return per_file[rel]


def _names(source: str) -> List[str]:
    """Top-level functions and classes defined in (a possibly truncated) file."""
    lines = source.split("\n")
    while lines:
        try:
            tree = ast.parse("\n".join(lines))
            break
        except SyntaxError:
            lines = lines[:-1]  # truncated mid-statement: drop the tail
    else:
        return []
    return [
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]


def system_prompt(preamble: str, tools: Sequence[dict]) -> str:
    return f"{preamble}\n\n# Tools\n{json.dumps(list(tools), indent=1)}\n\n{TOOL_FORMAT}"


def _call(tools, path):
    name = tools[0]["name"]
    arg = next(iter(tools[0]["parameters"]["properties"]))
    return f'<tool_call>{json.dumps({"name": name, "arguments": {arg: path}})}</tool_call>'


def transcript(
    tokenizer, n_tokens: int, seed: int, *, split: str = "train", exact: bool = True
) -> list:
    """Chat messages of an agent session of about `n_tokens` prompt tokens.

    Earlier turns read whole stdlib files of `split` (the last one cut to fit);
    the last user message asks about a function shown in the context. Lengths
    are estimated from per-line token counts (an overestimate: BPE merges
    across lines); `exact` then trims to at most `n_tokens` templated tokens.
    """
    from .prompts import encode_messages

    rng = random.Random(f"{split}:{seed}")
    preamble, tools = rng.choice(HARNESSES[split])
    files = stdlib_files(split)
    msgs = [{"role": "system", "content": system_prompt(preamble, tools)}]
    count = lambda m: len(tokenizer.encode(m["content"])) + 5  # noqa: E731
    used = sum(count(m) for m in msgs)
    final_reserve = 60  # the last request
    shown = []
    while used < n_tokens - final_reserve - 200:
        path = rng.choice(files)
        ask = {"role": "user", "content": rng.choice(EARLIER_ASKS[split]).format(path=path)}
        call = {"role": "assistant", "content": _call(tools, path)}
        used += count(ask) + count(call)
        room = n_tokens - final_reserve - used - 60
        lines, cum = _read(path).split("\n"), _line_tokens(tokenizer, path)
        # The longest line prefix that fits.
        keep = bisect.bisect_right(cum, room - 5) - 1
        text = "\n".join(lines[:keep])
        names = _names(text)
        result = {"role": "tool", "content": text}
        note_names = ", ".join(f"`{n}`" for n in names[:6]) or "only module-level code"
        note = {
            "role": "assistant",
            "content": rng.choice(NOTES[split]).format(path=path, names=note_names),
        }
        msgs += [ask, call, result, note]
        used += cum[keep] + 5 + count(note)
        if names:
            shown.append((path, names))
    if shown:
        path, names = rng.choice(shown)
        final = rng.choice(FINAL_ASKS[split]).format(path=path, name=rng.choice(names))
    else:
        final = "What should we look at next?"
    msgs.append({"role": "user", "content": final})
    # Trim the longest tool result if the estimate overshot.
    tools_at = [i for i, m in enumerate(msgs) if m["role"] == "tool"]
    while exact and tools_at and len(encode_messages(tokenizer, msgs)) > n_tokens:
        i = max(tools_at, key=lambda i: len(msgs[i]["content"]))
        lines = msgs[i]["content"].split("\n")
        msgs[i] = {"role": "tool", "content": "\n".join(lines[: int(len(lines) * 0.9)])}
    return msgs
