"""Streamed tokens, detokenised and timed: the one loop over `generate_step`.

`TokenStream` is what `mlx-dflash generate` (through `stream_generate`), the
server's generation thread and the bench do with each token they get: time
it (prefill runs from the start to the first token, decode from the first
token to the end) and turn it into text (stop tokens are never text).
"""

import time
from dataclasses import dataclass
from typing import Any, Generator, Iterable, List, Optional, Tuple

import mlx.core as mx

from .decode import generate_step
from .drafters import Drafter
from .fallback import Fallback
from .sampling import SamplingParams
from .stats import SpecStats
from .target import Target


class TokenStream:
    """Times the tokens of one generation and detokenises them.

    Args:
        detokenizer: an mlx_lm streaming detokenizer (None: time only).
        stop_tokens: timed like any token, never detokenised.
    """

    def __init__(self, detokenizer=None, stop_tokens: Iterable[int] = ()):
        self.detok = detokenizer
        if detokenizer is not None:
            detokenizer.reset()
        self.stop = frozenset(stop_tokens)
        self.start = time.perf_counter()
        self.first: Optional[float] = None  # when the first token came
        self.end: Optional[float] = None  # when `finish` was called

    def add(self, token: int) -> str:
        """A generated token: timed, then detokenised (see `text`)."""
        if self.first is None:
            self.first = time.perf_counter()
        return self.text(token)

    def text(self, token: int) -> str:
        """The text `token` completes ('' for a stop token or while a
        character is incomplete); a token the caller inserted is not timed."""
        if self.detok is None or token in self.stop:
            return ""
        self.detok.add_token(token)
        return self.detok.last_segment  # reading it consumes it

    def finish(self) -> str:
        """End the clock; the text the detokenizer still held back."""
        self.end = time.perf_counter()
        if self.detok is None:
            return ""
        self.detok.finalize()
        return self.detok.last_segment

    @property
    def prefill_s(self) -> float:
        """Start to the first token (0 before it)."""
        return 0.0 if self.first is None else self.first - self.start

    @property
    def decode_s(self) -> float:
        """First token to `finish` (or now); from the start when none came."""
        end = time.perf_counter() if self.end is None else self.end
        return end - (self.start if self.first is None else self.first)


@dataclass
class GenerationResponse:
    """One streamed piece of output, shaped like mlx_lm's, plus speculative stats."""

    text: str
    token: int
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: Optional[str] = None
    stats: Optional[SpecStats] = None
    logprob: Optional[float] = None
    top_logprobs: Optional[List[Tuple[int, float]]] = None


def stream_generate(
    target: Target,
    tokenizer,
    prompt,
    drafter: Drafter,
    *,
    max_tokens: int = 256,
    block_size: int = 16,
    stop_tokens: Optional[Iterable[int]] = None,
    prefill_step_size: int = 2048,
    cache: Optional[List[Any]] = None,
    cached: int = 0,
    sampling: Optional[SamplingParams] = None,
    logprobs: Optional[int] = None,
    fallback: Optional[Fallback] = None,
) -> Generator[GenerationResponse, None, None]:
    """Stream text like `mlx_lm.stream_generate`, decoding speculatively.

    Args:
        target, drafter: see `generate_step`.
        tokenizer: an mlx_lm `TokenizerWrapper`.
        prompt: a string (encoded as-is) or token ids.
        max_tokens, block_size, prefill_step_size, cache, cached, sampling,
          logprobs, fallback: see `generate_step`.
        stop_tokens: default: the tokenizer's EOS ids.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if isinstance(prompt, str):
        prompt = tokenizer.encode(prompt)
    prompt = list(prompt)
    stop = set(tokenizer.eos_token_ids if stop_tokens is None else stop_tokens)
    stats = SpecStats(block_size)
    stream = TokenStream(tokenizer.detokenizer, stop)
    n = 0
    token, from_draft, lp = None, False, (None, None)

    def response(text, finish_reason):
        return GenerationResponse(
            text=text,
            token=token,
            from_draft=from_draft,
            prompt_tokens=len(prompt),
            prompt_tps=(len(prompt) - cached) / max(stream.prefill_s, 1e-9),
            generation_tokens=n + 1,
            generation_tps=(n + 1) / max(stream.decode_s, 1e-9),
            peak_memory=mx.get_peak_memory() / 1e9,
            finish_reason=finish_reason,
            stats=stats,
            logprob=lp[0],
            top_logprobs=lp[1],
        )

    for n, step in enumerate(
        generate_step(
            target,
            prompt,
            drafter,
            max_tokens=max_tokens,
            block_size=block_size,
            stop_tokens=stop,
            prefill_step_size=prefill_step_size,
            cache=cache,
            cached=cached,
            sampling=sampling,
            logprobs=logprobs,
            fallback=fallback,
            stats=stats,
        )
    ):
        token, from_draft = step[:2]
        lp = step[2] if logprobs is not None else (None, None)
        text = stream.add(token)
        if token in stop or n + 1 == max_tokens:
            break
        yield response(text, None)
    # The last token's own text comes with the held-back tail.
    tail = stream.finish()
    yield response(text + tail, "stop" if token in stop else "length")
