"""The offline prompt set (no download).

Coding tasks synthesised from the signatures and docstrings of the Python
standard library (`inspect` over a fixed module list), plus general instructions
from templates x topics; a 'core' set (13.4k prompts) and a 'wide' one that
contains it (49.8k: class methods, more modules, templates and topics). The
held-out prompts are a fixed list shipped with the package (`held_out.json`,
drawn once by a hash of the prompt text), because the stdlib's docstrings differ
between Python versions; training skips every prompt whose hash falls in the
held-out share.
"""

import hashlib
import importlib
import inspect
import json
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence


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

# The wide set adds these modules, class methods and the extra templates/topics.
MORE_STDLIB_MODULES = (
    "builtins cProfile pstats code codeop compileall contextvars ctypes dbm doctest "
    "email.utils errno faulthandler gc getpass importlib importlib.metadata "
    "importlib.resources mmap modulefinder multiprocessing netrc opcode pdb "
    "poplib posixpath py_compile pyclbr pydoc runpy select site socketserver ssl "
    "stat symtable sys sysconfig unittest unittest.mock venv wsgiref "
    "wsgiref.simple_server xml.dom.minidom xml.sax xml.sax.saxutils xmlrpc.client "
    "xmlrpc.server zipapp zipimport zoneinfo http.server http.cookies "
    "http.cookiejar email.mime.text email.parser email.policy html.parser "
    "concurrent.futures.thread asyncio.subprocess asyncio.queues asyncio.locks "
    "asyncio.tasks asyncio.streams logging.config multiprocessing.pool "
    "multiprocessing.shared_memory sqlite3.dbapi2 urllib.error urllib.robotparser"
).split()

# Every stdlib callable gets all of these.
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

# Each callable also gets `EXTRA_PER_CALLABLE` of these, drawn by the seed.
EXTRA_CODE_TEMPLATES = (
    "Describe each parameter of `{qual}{sig}` and what it returns. Its documentation says: {doc}",
    "Write a small class that wraps `{qual}` and makes it easier to use, with an example.",
    "How would you implement `{name}{sig}` in another language, say JavaScript? Reference: {doc}",
    "I get an error when I call `{qual}`. What could be wrong, and how do I debug it?",
    "Give three examples of calling `{qual}` with different arguments and show the output.",
    "Write a docstring in Google style for `{name}{sig}`, which does this: {doc}",
    "Refactor this idea into clean Python: a helper that uses `{qual}` and handles errors. Docs: {doc}",
    "When should I use `{qual}` and when should I avoid it? Answer briefly with code.",
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

MORE_GENERAL_TEMPLATES = (
    "Write a short dialogue between two friends talking about {topic}.",
    "Explain {topic} to a ten-year-old using an analogy.",
    "Write a blog post outline about {topic} with five sections.",
    "What are the most common misconceptions about {topic}?",
    "Write a quiz of five multiple-choice questions about {topic}, with answers.",
    "Describe a day in the life of someone who works with {topic}.",
    "Write a persuasive paragraph arguing that everyone should learn about {topic}.",
    "Give a step-by-step guide for getting started with {topic}.",
    "Write a tweet thread of four tweets about {topic}.",
    "How has {topic} changed in the last fifty years?",
    "Write a poem of eight lines about {topic}.",
    "Explain the connection between {topic} and {other}.",
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

MORE_TOPICS = (
    "the French Revolution, the Industrial Revolution, the Renaissance, "
    "ancient Greece, the Silk Road, the Vikings, the Cold War, the moon landing, "
    "the Great Wall of China, the pyramids, dinosaurs, evolution, cells, bacteria, "
    "viruses, the immune system, the brain, memory, nutrition, vitamins, exercise, "
    "stress, habits, motivation, procrastination, negotiation, personal finance, "
    "investing, taxes, cryptocurrency, banking, insurance, real estate, "
    "supply and demand, globalization, trade, unemployment, entrepreneurship, "
    "solar panels, wind turbines, nuclear power, batteries, semiconductors, "
    "quantum computing, robotics, 3D printing, virtual reality, self-driving cars, "
    "drones, satellites, GPS, rockets, telescopes, microscopes, the periodic table, "
    "chemical reactions, acids and bases, gravity, light, sound, heat, friction, "
    "energy conservation, the speed of light, relativity, atoms, electrons, "
    "operating systems, compilers, APIs, web browsers, HTML and CSS, JavaScript, "
    "Python programming, Rust programming, SQL, regular expressions, testing software, "
    "debugging, code review, technical debt, microservices, containers, "
    "Linux, the command line, encryption, privacy, social media, email etiquette, "
    "data visualization, spreadsheets, project management, agile development, "
    "user experience design, accessibility, typography, color theory, architecture, "
    "interior design, fashion, knitting, woodworking, pottery, cooking pasta, "
    "making pizza, vegetarian cooking, spices, chocolate, cheese, wine, "
    "fermentation, farming, soil, composting, houseplants, birds, butterflies, "
    "whales, elephants, wolves, penguins, coral reefs, rainforests, glaciers, "
    "the Arctic, islands, lakes, tides, hurricanes, tornadoes, rainbows, "
    "clouds, seasons, time zones, calendars, maps, languages, grammar, "
    "writing fiction, storytelling, comedy, theater, opera, classical music, "
    "rock music, hip hop, dance, sculpture, comics, animation, podcasts, "
    "journalism, advertising, negotiation at work, mentoring, parenting, "
    "pets, volunteering, urban gardening, public transport, cycling in cities, "
    "hiking, swimming, tennis, cricket, marathon training, mountain climbing, "
    "sailing, fishing, astronomy for amateurs, stargazing, eclipses, comets"
).split(", ")

EXTRA_PER_CALLABLE = 2
SYSTEM = None  # use the chat template's default system prompt
HELD_OUT = Path(__file__).with_name("held_out.json")


@dataclass
class Prompt:
    text: str
    kind: str  # "code", "general", or a natural set's category
    messages: Optional[list] = None  # a whole chat (system, turns); text is its last message


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


def stdlib_functions(modules: Sequence[str] = STDLIB_MODULES, methods: bool = True):
    """(qualified name, name, signature, doc) of public stdlib callables.

    Module-level functions and classes, and with `methods` the public methods
    that each class defines itself (`str.split`, `pathlib.Path.glob`, ...).
    """
    out, seen = [], set()

    def add(qual, name, obj):
        doc = _first_doc_line(obj)
        if doc is None or qual in seen:
            return
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = "(...)"
        # Default values such as `<function f at 0x7f..>` differ per process.
        sig = re.sub(r" at 0x[0-9a-f]+", "", sig)
        if len(sig) > 120:
            return
        seen.add(qual)
        out.append((qual, name, sig, doc))

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
                add(f"{modname}.{name}", name, obj)
                if not (methods and inspect.isclass(obj)):
                    continue
                owner = "" if modname == "builtins" else f"{modname}."
                for meth, fn in sorted(vars(obj).items()):
                    if not meth.startswith("_") and callable(fn):
                        add(f"{owner}{name}.{meth}", meth, getattr(obj, meth, fn))
    return out


def build_prompts(*, seed: int = 0, held_out: float = 0.02, wide: bool = True):
    """The offline prompt set: `(train, held_out)` lists of `Prompt`.

    The core set: every callable of `STDLIB_MODULES` with a docstring gets
    every code template; every topic gets every general template (with a seeded
    partner topic for comparisons). The wide set (default) adds the methods of
    classes, `MORE_STDLIB_MODULES`, `EXTRA_PER_CALLABLE` seeded extra code
    templates per callable and more topics and templates; it contains the core
    set. Prompts whose text hashes into the `held_out` share, and the shipped
    held-out prompts, never reach training; the held-out list is the shipped
    one (the same on every machine).
    """
    rng, extra_rng = random.Random(seed), random.Random(seed + 1)
    modules = STDLIB_MODULES + (MORE_STDLIB_MODULES if wide else [])
    prompts = []
    for qual, name, sig, doc in stdlib_functions(modules, methods=wide):
        extra = (
            extra_rng.sample(EXTRA_CODE_TEMPLATES, EXTRA_PER_CALLABLE) if wide else []
        )
        for tpl in CODE_TEMPLATES + tuple(extra):
            prompts.append(
                Prompt(tpl.format(name=name, qual=qual, sig=sig, doc=doc), "code")
            )

    def general(topics, templates, pool, rng):
        for topic in topics:
            for tpl in templates:
                other = rng.choice([t for t in pool if t != topic])
                prompts.append(Prompt(tpl.format(topic=topic, other=other), "general"))

    general(TOPICS, GENERAL_TEMPLATES, TOPICS, rng)  # the core set's draws first
    if wide:
        every = TOPICS + MORE_TOPICS
        general(TOPICS, MORE_GENERAL_TEMPLATES, every, extra_rng)
        general(
            MORE_TOPICS, GENERAL_TEMPLATES + MORE_GENERAL_TEMPLATES, every, extra_rng
        )
    prompts = sorted(set((p.text, p.kind) for p in prompts))
    rng.shuffle(prompts)
    test = [Prompt(**p) for p in json.loads(HELD_OUT.read_text())]
    reserved = {p.text for p in test}
    train = [
        Prompt(t, k)
        for t, k in prompts
        if t not in reserved and not _held_out(t, held_out)
    ]
    return train, test


def encode(tokenizer, text: str) -> List[int]:
    """Chat-template a user message (generation prompt added) into token ids."""
    return encode_messages(tokenizer, [{"role": "user", "content": text}])


def encode_messages(tokenizer, messages: Sequence[dict]) -> List[int]:
    """Chat-template a conversation (generation prompt added) into token ids;
    without a template, the contents joined by newlines."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=True
            )
        )
    return list(tokenizer.encode("\n".join(m["content"] for m in messages)))


def encode_prompt(tokenizer, prompt: Prompt) -> List[int]:
    return encode_messages(
        tokenizer, prompt.messages or [{"role": "user", "content": prompt.text}]
    )
