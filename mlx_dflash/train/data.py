"""Training data: the target's own answers to the prompt set (prompts.py).

The target answers every prompt itself (greedy, batched in fixed shapes,
`greedy_batch`): the drafter learns the target's own outputs. `Dataset` keeps
the sequences (prompt + response) as one flat array with offsets.
"""

import random
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..cache import PaddedBatchKVCache
from ..kernels.attention import folded_steps
from .prompts import build_prompts, encode  # noqa: F401 - cli.py imports them here


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

    def subset(self, idx: Sequence[int]) -> "Dataset":
        """The sequences at `idx`, in that order."""
        return Dataset.from_lists(
            [self.sequence(int(i)) for i in idx], self.prompt_lens[np.asarray(idx, dtype=np.int64)]
        )

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

    def prompt_set(self) -> set:
        """The prompts answered, as token tuples."""
        return {
            tuple(self.tokens[o : o + n].tolist())
            for o, n in zip(self.offsets[:-1], self.prompt_lens)
        }

    @classmethod
    def join(cls, parts: Sequence["Dataset"]) -> "Dataset":
        """The sequences of `parts` in order; a prompt answered twice counts once."""
        seqs, plens, seen = [], [], set()
        for d in parts:
            for i in range(len(d)):
                s, n = d.sequence(i), int(d.prompt_lens[i])
                key = tuple(s[:n].tolist())
                if key not in seen:
                    seen.add(key)
                    seqs.append(s)
                    plens.append(n)
        return cls.from_lists(seqs, plens)

    def response_tokens(self) -> int:
        return int((np.diff(self.offsets) - self.prompt_lens).sum())


def generate_responses(
    target,
    prompts: Sequence[Sequence[int]],
    *,
    stop_tokens: Sequence[int],
    max_tokens: int = 256,
    batch_size: int = 256,
    time_budget: Optional[float] = None,
    min_response: int = 8,
    seed: int = 0,
    max_batch_tokens: Optional[int] = None,
    temperature: float = 0.0,
    progress: Optional[Callable[[int, int, int, float], None]] = None,
) -> Dataset:
    """Batched self-distillation: the target answers every prompt (greedy, or
    sampled at `temperature` with a seeded key).

    Prompts are sorted by length into batches of `batch_size` (little padding)
    and the batches run in a seeded random order, so a `time_budget` cut drops
    a random share rather than the longest prompts. The stop token is kept at
    the end of a finished response (the drafter must learn to predict it).
    When the budget (seconds) runs out, unfinished responses of at least
    `min_response` tokens are kept as they are.

    Args:
        target: a `Target`. Attention-only models decode in fixed shapes
          (`greedy_batch`); others fall back to mlx_lm's `BatchGenerator`
          (greedy only).
        max_batch_tokens: at most this many KV rows x columns per batch
          (prompt + `max_tokens`): batches of long prompts hold fewer rows.
        progress: called after each batch with (prompts done, total, response
          tokens, seconds).
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches, cur = [], []
    for i in order:  # ascending length: the newest prompt is the longest
        cols = len(prompts[i]) + max_tokens
        if cur and (
            len(cur) >= batch_size
            or (max_batch_tokens and (len(cur) + 1) * cols > max_batch_tokens)
        ):
            batches.append(cur)
            cur = []
        cur.append(i)
    batches += [cur] if cur else []
    random.Random(seed).shuffle(batches)
    fixed = all(type(c) is KVCache for c in target.make_cache(bucket=False))
    if temperature and not fixed:
        raise ValueError("sampled generation needs an attention-only target")
    key = mx.random.key(seed)
    seqs, plens, done, n_tok, t0 = [], [], 0, 0, time.perf_counter()
    for batch in batches:
        left = None if time_budget is None else time_budget - (time.perf_counter() - t0)
        if left is not None and left <= 0:
            break
        rows = [list(prompts[i]) for i in batch]
        key, sub = mx.random.split(key)
        extra = dict(temperature=temperature, key=sub) if temperature else {}
        gen = greedy_batch if fixed else _batch_generator
        outs = gen(
            target,
            rows,
            stop_tokens=stop_tokens,
            max_tokens=max_tokens,
            time_budget=left,
            **extra,
        )
        # Batches differ in shape, so their freed buffers rarely fit the next one; kept in
        # MLX's cache they ran an H100 out of memory in the third 1,024-row batch.
        mx.clear_cache()
        for p, out in zip(rows, outs):
            if len(out) >= min_response:
                seqs.append(p + out)
                plens.append(len(p))
            n_tok += len(out)
        done += len(batch)
        if progress is not None:
            progress(done, len(prompts), n_tok, time.perf_counter() - t0)
    return Dataset.from_lists(seqs, plens)


def greedy_batch(
    target,
    prompts: Sequence[Sequence[int]],
    *,
    stop_tokens: Sequence[int],
    max_tokens: int,
    time_budget: Optional[float] = None,
    pad_multiple: int = 32,
    min_rows: int = 8,
    prefill_chunk: int = 512,
    temperature: float = 0.0,
    key: Optional[mx.array] = None,
) -> List[List[int]]:
    """Greedy (or sampled, with `temperature` and `key`) continuations of
    `prompts`, decoded together in fixed shapes.

    Prompts are left-padded to one length and every layer gets a
    `PaddedBatchKVCache` sized for prompt + `max_tokens` (a 256-multiple), so
    each decode step has the same shapes; per-row RoPE offsets and the mask make
    padding invisible (each row equals its own unbatched greedy run). Rows stop
    at a stop token (kept) or `max_tokens`. When at most half the rows are
    still running, the batch shrinks to a power of two: a few shapes in all.
    Prompts longer than `prefill_chunk` are prefilled in chunks of it (the
    masked attention of one long chunk would hold rows x P x capacity scores).
    """
    R = len(prompts)
    lens = np.array([len(p) for p in prompts])
    P = -(-int(lens.max()) // pad_multiple) * pad_multiple
    capacity = -(-(P + max_tokens) // 256) * 256
    tokens = np.zeros((R, P), dtype=np.int32)
    for r, p in enumerate(prompts):
        tokens[r, P - len(p) :] = p
    pad = mx.array(P - lens, dtype=mx.int32)
    cache = [PaddedBatchKVCache(pad, capacity) for _ in target.layers]

    keys = [key]

    def step(x):
        logits, _ = target.forward(x, cache, last_only=True)
        if not temperature:
            return mx.argmax(logits[:, -1], axis=-1)
        keys[0], sub = mx.random.split(keys[0])
        return mx.random.categorical(logits[:, -1] * (1 / temperature), key=sub)

    deadline = None if time_budget is None else time.perf_counter() + time_budget
    stops = np.asarray(list(stop_tokens), dtype=np.int64)
    out = np.zeros((R, max_tokens), dtype=np.int64)
    length = np.zeros(R, dtype=np.int64)  # 0 while a row runs
    slots = np.arange(R)  # the prompt each batch row decodes
    # One-token steps attend in the fold (`FoldedSteps`); prefill chunks as stock.
    with folded_steps(target.layers):
        for c0 in range(0, P - prefill_chunk, prefill_chunk):
            target.forward(mx.array(tokens[:, c0 : c0 + prefill_chunk]), cache, last_only=True)
            mx.eval([c.keys for c in cache])
        c0 = max(0, (P - 1) // prefill_chunk * prefill_chunk)
        y = step(mx.array(tokens[:, c0:]))
        mx.async_eval(y)
        for t in range(max_tokens):
            # Queue step t+1 before reading step t: the host waits once per step.
            nxt = step(y[:, None]) if t + 1 < max_tokens else None
            if nxt is not None:
                mx.async_eval(nxt)
            tok = np.array(y)
            live = length[slots] == 0
            rows = slots[live]
            out[rows, t] = tok[live]
            length[rows[np.isin(tok[live], stops)]] = t + 1
            running = length[slots] == 0
            if not running.any() or nxt is None:
                break
            if deadline is not None and time.perf_counter() > deadline:
                break
            if running.sum() <= len(slots) // 2 and len(slots) > min_rows:
                # Fill up to a power of two with finished rows (their output is ignored).
                keep = np.flatnonzero(running)
                size = max(min_rows, 1 << int(len(keep) - 1).bit_length())
                keep = np.concatenate([keep, np.flatnonzero(~running)[: size - len(keep)]])
                idx = mx.array(keep)
                for c in cache:
                    c.filter(idx)
                nxt, slots = nxt[idx], slots[keep]
            y = nxt
    length[length == 0] = t + 1
    return [out[r, : length[r]].tolist() for r in range(R)]


def _batch_generator(
    target, prompts, *, stop_tokens, max_tokens, time_budget=None, **_
) -> List[List[int]]:
    """mlx_lm's `BatchGenerator`, for models whose caches are not plain KV caches."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        target.model,
        max_tokens=max_tokens,
        stop_tokens=[[int(t)] for t in stop_tokens],
        completion_batch_size=len(prompts),
        prefill_batch_size=min(len(prompts), 64),
    )
    uids = gen.insert([list(p) for p in prompts], [max_tokens] * len(prompts))
    out = {u: [] for u in uids}
    t0 = time.perf_counter()
    try:
        while responses := gen.next_generated():
            for r in responses:
                out[r.uid].append(int(r.token))
            if time_budget is not None and time.perf_counter() - t0 > time_budget:
                break
    finally:
        gen.close()
    return [out[u] for u in uids]
