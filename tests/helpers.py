"""Helpers the tests share: tiny tokenizers and models, a live server, drafters.

`models.py` builds the tiny random mlx_lm models; this module builds on it. Fixtures
that several files use (`srv`, `tool_srv`) are in conftest.py.
"""

import copy
import itertools
import json
import socket
import subprocess
import sys
import threading
import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_map
from mlx_lm.generate import generate_step as stock_generate_step
from mlx_lm.models.cache import KVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.tool_parsers import json_tools
from mlx_lm.utils import _get_classes
from models import CONFIGS, VOCAB, tiny_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from mlx_dflash.decode import generate_step
from mlx_dflash.draft import DFlashDraft, DraftArgs
from mlx_dflash.drafters import DFlashDrafter, OracleDrafter, PromptLookupDrafter
from mlx_dflash.sampling import SamplingParams, probs
from mlx_dflash.stats import SpecStats
from mlx_dflash.target import Target


def on_cuda(test):
    """Marked `cuda` (deselect with -m "not cuda") and skipped without MLX CUDA."""
    skip = pytest.mark.skipif(not mx.cuda.is_available(), reason="needs MLX CUDA")
    return pytest.mark.cuda(skip(test))


# ---- tokenizer, models and a live server ----------------------------------------

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
THINK = ["<think>", "</think>"]
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "Tools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if not (tools and loop.first and m.role == 'system') %}"
    "<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for tc in m.tool_calls or [] %}<tool_call>"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer(words=(), think=False) -> TokenizerWrapper:
    """Character-level tokenizer (+ whole-word tokens) with a chatml tool template."""
    specials = SPECIALS + (THINK if think else [])
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    # Dense ids (a word that is also a character keeps one id): a model sized
    # len(vocab) must see no id past its embedding table, whose out-of-range rows
    # MLX reads from whatever memory follows it (nondeterministic garbage).
    vocab = {t: i for i, t in enumerate(dict.fromkeys(specials + list(words) + chars))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials[1:])
    tok.add_tokens(list(words))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        unk_token="<unk>",
        chat_template=TEMPLATE,
    )
    return TokenizerWrapper(
        hf,
        tool_parser=json_tools.parse_tool_call,
        tool_call_start="<tool_call>",
        tool_call_end="</tool_call>",
    )


def chat_model(family: str, vocab: int, seed: int = 0) -> nn.Module:
    """models.py's tiny model, with the vocabulary of a `make_tokenizer` tokenizer."""
    config = copy.deepcopy(CONFIGS[family])
    config.get("text_config", config)["vocab_size"] = vocab
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * 3.0 if p.ndim == 2 else p, model.parameters()))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


class _Backbone(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, vocab)
        self.embed_tokens.weight = mx.eye(vocab)
        self.layers = []

    def __call__(self, tokens, cache=None):
        return self.embed_tokens(tokens)


class ScriptedModel(nn.Module):
    """Greedy output follows a fixed chain: the token after `a` is `script[a]`."""

    def __init__(self, vocab, script: dict, default: int):
        super().__init__()
        self.model = _Backbone(vocab)
        self.lm_head = nn.Linear(vocab, vocab, bias=False)
        w = mx.zeros((vocab, vocab))
        nxt = [script.get(a, default) for a in range(vocab)]
        w[mx.array(nxt), mx.arange(vocab)] = 10.0
        self.lm_head.weight = w
        # Evaluate here: a lazy graph built on this thread can't run on another.
        mx.eval(self.parameters())


class LiveServer:
    """uvicorn on 127.0.0.1, port 0, in a thread."""

    def __init__(self, provider, *, api_key=None, app_args=None, wrap=None, **config):
        """`wrap`: an ASGI middleware class put around the app (e.g. a recorder);
        the wrapped app is `self.app`."""
        # Greedy unless a request names a temperature: outputs are comparable.
        config = {"default_temperature": 0.0, **config}
        # Server-only imports here: the CUDA machine runs the kernel tests
        # without the HTTP stack and SDKs installed.
        import anthropic
        import openai
        import uvicorn

        from mlx_dflash.server import Engine, EngineConfig, create_app
        from mlx_dflash.server.cli import uvicorn_config

        self.engine = Engine(
            provider, EngineConfig(model_name="tiny", **config)
        ).start()
        app = create_app(self.engine, api_key=api_key, **(app_args or {}))
        self.app = app if wrap is None else wrap(app)
        # serve's own settings (keep-alive): the SDK clients below pool.
        self.server = uvicorn.Server(
            uvicorn_config(self.app, "127.0.0.1", 0, "warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        key = api_key or "unused"
        self.openai = openai.OpenAI(
            base_url=self.url + "/v1", api_key=key, max_retries=0
        )
        self.anthropic = anthropic.Anthropic(
            base_url=self.url, api_key=key, max_retries=0
        )

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.stop()


def random_provider(family="qwen3", block_size=4):
    tok = make_tokenizer()
    target = Target(chat_model(family, len(tok)))
    return lambda: (target, tok, PromptLookupDrafter(), block_size)


def expected(srv, prompt, max_tokens):
    """The core path's tokens and text for `prompt` (token ids)."""
    tok = srv.engine.tokenizer
    out = []
    for t, _ in generate_step(
        srv.engine.target,
        prompt,
        PromptLookupDrafter(),
        max_tokens=max_tokens,
        block_size=4,
        stop_tokens=tok.eos_token_ids,
    ):
        out.append(t)
    body = [t for t in out if t not in tok.eos_token_ids]
    return out, tok.decode(body)


MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Count: one two three one two three one two"},
]


def chat_prompt(srv, messages, tools=None):
    return srv.engine.tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True
    )


CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOLS_OA = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    }
]
TOOLS_AN = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": TOOLS_OA[0]["function"]["parameters"],
    }
]


def tool_provider():
    """A scripted target that thinks, answers and calls get_weather on cue."""
    words = ["hmm, weather", "Let me check.", CALL]
    tok = make_tokenizer(words, think=True)
    ids = {
        w: tok.convert_tokens_to_ids(w)
        for w in [
            "\n",
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            "<|im_end|>",
            *words,
        ]
    }
    chain = [
        "\n",
        "<think>",
        "hmm, weather",
        "</think>",
        "Let me check.",
        "<tool_call>",
        CALL,
        "</tool_call>",
        "<|im_end|>",
    ]
    script = {ids[a]: ids[b] for a, b in zip(chain, chain[1:])}
    target = Target(ScriptedModel(len(tok), script, default=ids["<|im_end|>"]))
    return lambda: (target, tok, PromptLookupDrafter(), 4)


class _Slow(nn.Module):
    """A backbone that takes `delay` seconds per forward, as a big model would."""

    def __init__(self, inner, delay):
        super().__init__()
        self.inner = inner
        self.delay = delay
        self.layers = []
        self.embed_tokens = inner.embed_tokens

    def __call__(self, tokens, cache=None):
        time.sleep(self.delay)
        return self.inner(tokens, cache)


def slow_provider(delay=0.02, block_size=4, word="a"):
    tok = make_tokenizer([word] if len(word) > 1 else [])
    a = tok.convert_tokens_to_ids(word)
    model = ScriptedModel(len(tok), {}, default=a)  # "aaaa…", never EOS
    model.model = _Slow(model.model, delay)
    target = Target(model)
    return lambda: (target, tok, PromptLookupDrafter(), block_size)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_process(model_dir, *flags: str):
    """`python -m mlx_dflash.serve` on loopback (prompt lookup drafter), in its
    own process; returns (process, url) once /health answers."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_dflash.serve", "--model", str(model_dir)]
        + ["--draft", "lookup", "--port", str(port), "--served-model-name", "tiny"]
        + ["--log-level", "warning", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "server did not start"
        time.sleep(0.2)


# ---- greedy decoding against stock mlx_lm ------------------------------------

PROMPT = [1, 5, 9, 3, 7, 2, 8, 4, 6, 10, 11, 12, 5, 9, 3]
N = 48

_cache = {}


def setup(family):
    """(model, stock greedy output for PROMPT), built once per family."""
    if family not in _cache:
        model = tiny_model(family)
        ref = [t for t, _ in stock_generate_step(mx.array(PROMPT), model, max_tokens=N)]
        _cache[family] = (model, ref)
    return _cache[family]


def random_dflash(target: Target, seed=1, layers=2) -> DFlashDrafter:
    mx.random.seed(seed)
    args = DraftArgs(
        hidden_size=target.hidden_size,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        target_layer_ids=[1, 2],
        mask_token_id=VOCAB - 1,
        rope_theta=10000.0,
    )
    draft = DFlashDraft(args)
    draft.set_dtype(mx.float32)
    target.set_capture_layers(args.target_layer_ids)
    return DFlashDrafter(draft, target)


def make_drafter(kind, target, ref):
    if kind == "dflash":
        return random_dflash(target)
    if kind == "lookup":
        return PromptLookupDrafter()
    # Rejects at every draft position in turn, and sometimes accepts it all.
    return OracleDrafter(PROMPT + ref, vocab_size=VOCAB, schedule=list(range(16)))


def run(target, drafter, **kw):
    stats = SpecStats(kw.get("block_size", 16))
    out = [t for t, _ in generate_step(target, PROMPT, drafter, stats=stats, **kw)]
    return out, stats


# ---- z-lab draft checkpoints ---------------------------------------------------

H, LAYERS, HEADS, KV, HD, FF = 64, 2, 4, 2, 16, 96


def zlab_config(**over):
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 16,
        "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, 2]},
        "num_target_layers": 4,
        "hidden_size": H,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": HD,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "layer_types": ["full_attention", "sliding_attention"],
        "sliding_window": 8,
        "max_position_embeddings": 4096,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
    }
    cfg.update(over)
    return cfg


def zlab_weights(n_feat=2):
    """Random weights under the exact key names of z-lab checkpoints."""
    rng = np.random.default_rng(0)
    w = lambda *s: mx.array(rng.normal(0, 0.1, s).astype(np.float32))
    weights = {
        "fc.weight": w(H, n_feat * H),
        "hidden_norm.weight": mx.ones((H,)),
        "norm.weight": mx.ones((H,)),
    }
    for i in range(LAYERS):
        p = f"layers.{i}."
        weights.update(
            {
                p + "self_attn.q_proj.weight": w(HEADS * HD, H),
                p + "self_attn.k_proj.weight": w(KV * HD, H),
                p + "self_attn.v_proj.weight": w(KV * HD, H),
                p + "self_attn.o_proj.weight": w(H, HEADS * HD),
                p + "self_attn.q_norm.weight": mx.ones((HD,)),
                p + "self_attn.k_norm.weight": mx.ones((HD,)),
                p + "mlp.gate_proj.weight": w(FF, H),
                p + "mlp.up_proj.weight": w(FF, H),
                p + "mlp.down_proj.weight": w(H, FF),
                p + "input_layernorm.weight": mx.ones((H,)),
                p + "post_attention_layernorm.weight": mx.ones((H,)),
            }
        )
    return weights


def write(path, cfg, weights):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


# ---- sampling distribution (chi-square against exact enumeration) --------------

SMALL_V = 8
SMALL_PROMPT = [1, 5, 3, 7, 2]


def small_vocab_model():
    # Small and cheap: the test draws tens of thousands of sequences on a CPU.
    config = dict(
        CONFIGS["llama"],
        vocab_size=SMALL_V,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(3)
    model = model_cls(args_cls.from_dict(config))
    model.update(tree_map(lambda p: p * 0.7 if p.ndim == 2 else p, model.parameters()))
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return model


def exact_joint(model, params):
    """P(first three tokens) under target-only sampling, by enumeration."""

    def dist(prefix):
        logits = model(mx.array([SMALL_PROMPT + list(prefix)]))[0, -1]
        return np.array(probs(logits, params)).astype(np.float64)

    joint = np.zeros((SMALL_V, SMALL_V, SMALL_V))
    p1 = dist(())
    for a in range(SMALL_V):
        if p1[a] == 0:
            continue
        p2 = dist((a,))
        for b in range(SMALL_V):
            if p2[b] == 0:
                continue
            joint[a, b] = p1[a] * p2[b] * dist((a, b))
    joint = joint.ravel().astype(np.float64)
    return joint / joint.sum()  # fp32 rows sum to 1 only within rounding


def small_drafter(target):
    mx.random.seed(5)
    args = DraftArgs(
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=SMALL_V,
        target_layer_ids=[0, 1],
        mask_token_id=0,
        rope_theta=10000.0,
    )
    draft = DFlashDraft(args)
    draft.set_dtype(mx.float32)
    target.set_capture_layers(args.target_layer_ids)
    return DFlashDrafter(draft, target)


def sample_counts(target, drafter, params, n):
    """Counts of the first three tokens of `n` runs, run s seeded with s."""
    counts = np.zeros(SMALL_V**3)
    for s in range(n):
        p = SamplingParams(**{**params.__dict__, "seed": s})
        steps = generate_step(
            target, SMALL_PROMPT, drafter, max_tokens=5, block_size=3, sampling=p
        )
        # Stop at the third token: the same tokens as running to max_tokens,
        # without the cycles after it.
        a, b, c = (t for t, _ in itertools.islice(steps, 3))
        steps.close()
        counts[(a * SMALL_V + b) * SMALL_V + c] += 1
    return counts


def chi2_pvalue(counts, joint):
    # Pool cells with small expectation so the chi-square approximation holds.
    expected = joint * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert counts[joint == 0].sum() == 0, "sampled a token the target cannot produce"
    from scipy.stats import chisquare

    return chisquare(obs, exp).pvalue


# ---- the command line -------------------------------------------------------------


def run_cli(*args):
    """`mlx-dflash ARGS` in a fresh process (its output captured)."""
    cmd = [sys.executable, "-m", "mlx_dflash.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


class _Seen(nn.Module):
    """Marks every position at or after the first `marker` token, across calls:
    its KV cache holds one 0/1 value per position, so rollback is a trim."""

    def __init__(self, vocab, marker):
        super().__init__()
        self.vocab, self.marker = vocab, marker

    def __call__(self, x, mask=None, cache=None):
        n = x.shape[1]
        hit = x[:, None, :, self.marker : self.marker + 1]  # (1, 1, L, 1)
        _, hits = cache.update_and_fetch(hit, hit)
        seen = mx.cummax(hits, axis=2)[:, 0, -n:]  # (1, L, 1)
        v = self.vocab
        return mx.concatenate([x[..., :v] * (1 - seen), x[..., v:] * seen], axis=-1)


class _SeenBackbone(nn.Module):
    def __init__(self, vocab, marker):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, 2 * vocab)
        self.embed_tokens.weight = mx.concatenate([mx.eye(vocab)] * 2, axis=1)
        self.layers = [_Seen(vocab, marker)]

    def __call__(self, tokens, cache=None):
        cache = cache or [KVCache()]
        return self.layers[0](self.embed_tokens(tokens), None, cache[0])


class BranchModel(nn.Module):
    """Greedy output follows `before[a]` until the prompt or the output has
    held `marker`, then `after[a]`: a scripted model that reads its context."""

    def __init__(self, vocab, marker, before: dict, after: dict, default: int):
        super().__init__()
        self.model = _SeenBackbone(vocab, marker)
        self.lm_head = nn.Linear(2 * vocab, vocab, bias=False)
        w = mx.zeros((vocab, 2 * vocab))
        for half, script in enumerate((before, after)):
            nxt = [script.get(a, default) for a in range(vocab)]
            w[mx.array(nxt), mx.arange(vocab) + half * vocab] = 10.0
        self.lm_head.weight = w
        mx.eval(self.parameters())

    def __call__(self, tokens, cache=None):
        return self.lm_head(self.model(tokens, cache))

    def make_cache(self):
        return [KVCache()]


# ---- Qwen tool formats and reasoning (scripted) ---------------------------------

# Qwen3.5's switch: the generation prompt opens the think block, or closes it.
THINK_TEMPLATE = TEMPLATE.replace(
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}",
)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "hours": {"type": "array"},
    },
}
QWEN_TOOLS_OA = [
    {"type": "function", "function": {"name": n, "description": d, "parameters": p}}
    for n, d, p in [
        ("get_weather", "Weather", WEATHER),
        ("get_time", "The time", {"type": "object", "properties": {}}),
    ]
]
QWEN_TOOLS_AN = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
    for t in QWEN_TOOLS_OA
]
# Values by the schema: "075" stays a string, the rest are parsed.
CALLS = [
    ("get_weather", {"city": "075", "days": 3, "metric": True, "hours": [9, 12]}),
    ("get_time", {}),
]
XML_ARGS = (
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=hours>\n[9, 12]\n</parameter>\n"
)
REASONING, ANSWER = "hmm, weather", "Let me check."
# Each chain follows the prompt's last token ("\n"). Markers are cut across
# tokens; every format also writes a call with no name, which must vanish.
CHAINS = {
    "xml": [
        "hmm, weather",
        "</think>",
        "\n\nLet me check.",
        "\n\n",
        "<tool_call>",
        "\n<func",
        "tion=get_weather>\n<param",
        "eter=city>\n075\n</para",
        "meter>\n" + XML_ARGS + "</function>\n</tool",
        "_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "\n<tool_call>\n<function=>\n</function>\n</tool_call>",
    ],
    "bare": [
        "hmm, weather",
        "</think>",
        "\n\nLet me check.",
        "\n\n<fun",
        "ction=get_weather>\n<parameter=city>\n075\n</parameter>\n" + XML_ARGS,
        "</func",
        "tion>\n</tool_call>\n<function=get_time>\n</function>",
        "\n<function=>\n</function>",
    ],
    "json": [
        "<think>",
        "hmm, weather",
        "</th",
        "ink>\n\nLet me check.",
        "\n\n<tool_call>",
        '\n{"name": "get_weather", "argu',
        'ments": {"city": "075", "days": 3, "metric": true, "hours": [9, 12]}}'
        "\n</tool_",
        'call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        '\n<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',
    ],
}
MARKUP = ["<tool_call", "</tool_call", "<function", "</function", "<parameter"]
MARKUP += ["</parameter", "<think", "</think", "tool_call>"]


def qwen_tokenizer(words, parser, *, opens_think: bool) -> TokenizerWrapper:
    """The test tokenizer with think tokens and an mlx_lm tool parser module."""
    hf = make_tokenizer(words, think=True)._tokenizer
    if opens_think:
        hf.chat_template = THINK_TEMPLATE
    return TokenizerWrapper(
        hf,
        tool_parser=parser.parse_tool_call,
        tool_call_start=parser.tool_call_start,
        tool_call_end=parser.tool_call_end,
    )


def scripted_server(chain, tok) -> LiveServer:
    chain = ["\n", *chain, "<|im_end|>"]
    ids = [tok.convert_tokens_to_ids(w) for w in chain]
    assert len(set(ids)) == len(ids) and tok.unk_token_id not in ids
    target = Target(ScriptedModel(len(tok), dict(zip(ids, ids[1:])), ids[-1]))
    return LiveServer(lambda: (target, tok, PromptLookupDrafter(), 4))


def no_markup(text):
    assert not any(m in (text or "") for m in MARKUP), text


MSGS = [{"role": "user", "content": "Weather?"}]
