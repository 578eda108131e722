"""Training data: an offline prompt set and self-distilled responses.

Prompt set (no download): coding tasks synthesised from the signatures and
docstrings of the Python standard library (`inspect` over a fixed module list),
plus general instructions from templates x topics. The held-out split is chosen
by a hash of the prompt text, so it does not depend on the Python version that
built the set. The target then answers every prompt itself (greedy, batched
with mlx_lm's `BatchGenerator`): the drafter learns the target's own outputs.
"""

import hashlib
import importlib
import inspect
import random
import time
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np

STDLIB_MODULES = (
    "abc argparse array ast asyncio base64 binascii bisect bz2 calendar cmath "
    "codecs collections colorsys configparser contextlib copy csv dataclasses "
    "datetime decimal difflib dis email enum filecmp fileinput fnmatch fractions "
    "ftplib functools getopt gettext glob graphlib gzip hashlib heapq hmac html "
    "http imaplib inspect io ipaddress itertools json keyword linecache locale "
    "logging lzma mailbox math mimetypes numbers operator optparse os pathlib "
    "pickle pkgutil platform plistlib pprint queue quopri random re reprlib "
    "sched secrets selectors shelve shlex shutil signal smtplib socket "
    "sqlite3 statistics string stringprep struct subprocess tarfile tempfile "
    "textwrap threading time timeit tokenize tomllib trace traceback types "
    "typing unicodedata urllib uuid warnings wave weakref zipfile zlib "
    "collections.abc concurrent.futures json.decoder logging.handlers os.path "
    "urllib.parse urllib.request xml.etree.ElementTree email.message http.client"
).split()

CODE_TEMPLATES = (
    "Write a Python function `{name}{sig}` that does the following: {doc}",
    "Implement `{qual}{sig}` from scratch in pure Python. Its documentation says: {doc}",
    "Explain what `{qual}` does in Python and give a short example of how to use it.",
    "Write pytest unit tests for `{qual}{sig}`. It is documented as: {doc}",
    "Show me how to use `{qual}` to solve a practical problem, with code and a brief explanation.",
    "What are common mistakes when using `{qual}`? Give a corrected code example.",
    "Rewrite a simple version of `{qual}` in Python with type hints and a docstring. Reference: {doc}",
    "Write a command-line script that uses `{qual}`. Keep it short and add comments.",
)

GENERAL_TEMPLATES = (
    "Explain {topic} to a beginner in a few paragraphs.",
    "Give me three practical tips about {topic}.",
    "Write a short story that involves {topic}.",
    "What are the pros and cons of {topic}?",
    "Summarize the history of {topic} in five sentences.",
    "Write a haiku and a limerick about {topic}.",
    "Create a study plan for learning about {topic} in two weeks.",
    "Write a polite email to a colleague asking for help with {topic}.",
    "List five interesting facts about {topic}.",
    "Compare {topic} with {other} in a short table and a conclusion.",
    "Answer as a teacher: why does {topic} matter in everyday life?",
    "Write a product description for something related to {topic}.",
)

TOPICS = (
    "photosynthesis, the water cycle, black holes, volcanoes, climate change, "
    "renewable energy, electric cars, the stock market, inflation, budgeting, "
    "healthy eating, sleep, meditation, running, yoga, chess, gardening, "
    "baking bread, coffee, tea, the Roman Empire, ancient Egypt, the printing press, "
    "the internet, machine learning, neural networks, databases, cloud computing, "
    "cybersecurity, passwords, open source software, version control with git, "
    "recursion, sorting algorithms, binary search, hash tables, linked lists, "
    "graph algorithms, prime numbers, probability, statistics, geometry, calculus, "
    "music theory, jazz, painting, photography, film making, public speaking, "
    "job interviews, time management, remote work, teamwork, leadership, "
    "learning a new language, traveling on a budget, camping, recycling, "
    "bees, dolphins, dogs, cats, forests, oceans, deserts, the moon, Mars, "
    "the solar system, vaccines, the human heart, DNA, friendship, kindness, "
    "writing a resume, starting a small business, marketing, customer service, "
    "electricity, magnets, bridges, airplanes, trains, bicycles, smartphones, "
    "video games, board games, football, basketball, the Olympic Games, "
    "weather forecasting, earthquakes, rivers, mountains, city planning, "
    "libraries, museums, poetry, mythology, philosophy, ethics, democracy"
).split(", ")

SYSTEM = None  # use the chat template's default system prompt


@dataclass
class Prompt:
    text: str
    kind: str  # "code" or "general"


def _held_out(text: str, fraction: float) -> bool:
    h = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def _first_doc_line(obj) -> Optional[str]:
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    para = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    if len(para) < 12 or len(para) > 400:
        return None
    return para


def stdlib_functions(modules: Sequence[str] = STDLIB_MODULES):
    """(qualified name, name, signature, doc) of public stdlib callables."""
    out, seen = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for modname in modules:
            try:
                mod = importlib.import_module(modname)
            except Exception:
                continue
            for name, obj in sorted(vars(mod).items()):
                if name.startswith("_") or not callable(obj):
                    continue
                if getattr(obj, "__module__", modname) not in (modname, None) and not (
                    str(getattr(obj, "__module__", "")).lstrip("_") == modname
                ):
                    continue
                qual = f"{modname}.{name}"
                doc = _first_doc_line(obj)
                if doc is None or qual in seen:
                    continue
                try:
                    sig = str(inspect.signature(obj))
                except (TypeError, ValueError):
                    sig = "(...)"
                if len(sig) > 120:
                    continue
                seen.add(qual)
                out.append((qual, name, sig, doc))
    return out


def build_prompts(*, seed: int = 0, held_out: float = 0.02):
    """The offline prompt set: `(train, held_out)` lists of `Prompt`.

    Every stdlib callable with a docstring gets every code template; every
    topic gets every general template (with a seeded partner topic for
    comparisons). The split is by a hash of the text.
    """
    rng = random.Random(seed)
    prompts = []
    for qual, name, sig, doc in stdlib_functions():
        for tpl in CODE_TEMPLATES:
            prompts.append(
                Prompt(tpl.format(name=name, qual=qual, sig=sig, doc=doc), "code")
            )
    for topic in TOPICS:
        for tpl in GENERAL_TEMPLATES:
            other = rng.choice([t for t in TOPICS if t != topic])
            prompts.append(Prompt(tpl.format(topic=topic, other=other), "general"))
    prompts = sorted(set((p.text, p.kind) for p in prompts))
    rng.shuffle(prompts)
    prompts = [Prompt(t, k) for t, k in prompts]
    train = [p for p in prompts if not _held_out(p.text, held_out)]
    test = [p for p in prompts if _held_out(p.text, held_out)]
    return train, test


def encode(tokenizer, text: str) -> List[int]:
    """Chat-template a user message (generation prompt added) into token ids."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": text}]
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        )
    return list(tokenizer.encode(text))


@dataclass
class Dataset:
    """Sequences (prompt + response) as one flat uint32 array with offsets."""

    tokens: np.ndarray
    offsets: np.ndarray  # len n+1
    prompt_lens: np.ndarray

    def __len__(self):
        return len(self.prompt_lens)

    def sequence(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def from_lists(cls, seqs: Sequence[Sequence[int]], prompt_lens: Sequence[int]):
        lens = np.array([len(s) for s in seqs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        flat = (
            np.concatenate([np.asarray(s, dtype=np.uint32) for s in seqs])
            if seqs
            else np.zeros(0, np.uint32)
        )
        return cls(flat, offsets, np.asarray(prompt_lens, dtype=np.int64))

    def save(self, path):
        dtype = (
            np.uint16
            if self.tokens.size == 0 or self.tokens.max() < 65536
            else np.uint32
        )
        np.savez_compressed(
            path,
            tokens=self.tokens.astype(dtype),
            offsets=self.offsets,
            prompt_lens=self.prompt_lens,
        )

    @classmethod
    def load(cls, path):
        z = np.load(path)
        return cls(z["tokens"].astype(np.uint32), z["offsets"], z["prompt_lens"])

    def response_tokens(self) -> int:
        return int((np.diff(self.offsets) - self.prompt_lens).sum())


def generate_responses(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    stop_tokens: Sequence[int],
    max_tokens: int = 256,
    batch_size: int = 256,
    time_budget: Optional[float] = None,
    min_response: int = 8,
    progress: Optional[Callable[[int, int, int, float], None]] = None,
) -> Dataset:
    """Greedy, batched self-distillation: the target answers every prompt.

    The stop token is kept at the end of a finished response (the drafter must
    learn to predict it). With `time_budget` (seconds), generation stops then and
    unfinished responses of at least `min_response` tokens are kept as they are.
    """
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=[[int(t)] for t in stop_tokens],
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 64),
    )
    uids = gen.insert([list(p) for p in prompts], [max_tokens] * len(prompts))
    out = {u: [] for u in uids}
    done, n_tok, t0 = 0, 0, time.perf_counter()
    try:
        while responses := gen.next_generated():
            for r in responses:
                out[r.uid].append(int(r.token))
                n_tok += 1
                if r.finish_reason is not None:
                    done += 1
            elapsed = time.perf_counter() - t0
            if progress is not None:
                progress(done, len(prompts), n_tok, elapsed)
            if time_budget is not None and elapsed > time_budget:
                break
    finally:
        gen.close()
    seqs, plens = [], []
    for u, p in zip(uids, prompts):
        if len(out[u]) >= min_response:
            seqs.append(list(p) + out[u])
            plens.append(len(p))
    return Dataset.from_lists(seqs, plens)
