"""A profile of the speculative cycle's parts at one key length.

Warm verify and draft forwards, a one-token forward, and the first call at each
new key length (JIT compiles on CUDA), each from a restored cache; `runner.py`
runs it once per arm and case.
"""

import time
from typing import Dict, List, Sequence

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from ..decode import prefill
from ..rollback import rollback, snapshot
from ..target import Target
from .stats import summarize


def _save(cache):
    return [list(c.cache) if isinstance(c, ArraysCache) else c.offset for c in cache]


def _restore(cache, saved):
    for c, s in zip(cache, saved):
        if isinstance(c, ArraysCache):
            c.cache[:] = s
        else:
            c.trim(c.offset - s)


def _ms(f, reps: int) -> List[float]:
    out = []
    for _ in range(reps):
        tic = time.perf_counter()
        f()
        out.append((time.perf_counter() - tic) * 1e3)
    return out


def profile_cycle(
    target: Target,
    prompt: Sequence[int],
    drafter,
    block: int,
    *,
    reps: int = 10,
    new_lengths: int = 4,
) -> Dict[str, float]:
    """Median ms of the cycle's parts at the prompt's length.

    verify_ms / draft_ms / fwd1_ms: warm forwards at one fixed key length
    (B tokens through the target with argmax; the drafter's propose; one
    target token), each built and run as the decode loop does (`flush=True`).
    *_new_len_ms: first call at each of `new_lengths` new key
    lengths, as the decode loop sees them (on CUDA this includes the JIT
    compile of 16-query attention for that length).
    """
    cache = target.make_cache()
    # The engine's cost is its real-size DFlash forward (its oracle tokens are free).
    proposer = getattr(drafter, "dflash", drafter)
    has_draft = proposer is not None and hasattr(proposer, "propose")
    sink = drafter if drafter is not None else _NullDrafter()
    logits = prefill(target, cache, sink, prompt)
    anchor = int(mx.argmax(logits, axis=-1).item())
    block_in = mx.array(
        [[anchor] + [(anchor + i) % 7 for i in range(1, block)]], mx.uint32
    )
    one = mx.array([[anchor]], mx.uint32)

    def fwd(tokens):
        saved = _save(cache)
        logits, _ = target.forward(tokens, cache, flush=True)
        mx.eval(mx.argmax(logits, axis=-1))
        _restore(cache, saved)

    def draft():
        mx.eval(proposer.propose(anchor, block - 1))

    out = {}
    fwd(block_in), fwd(one)  # compile for this length
    out["verify_ms"] = summarize(_ms(lambda: fwd(block_in), reps))["median"]
    out["fwd1_ms"] = summarize(_ms(lambda: fwd(one), reps))["median"]
    if has_draft:
        draft()
        out["draft_ms"] = summarize(_ms(draft, reps))["median"]
    else:
        out["draft_ms"] = 0.0

    # First calls at new key lengths: advance every cache by one token each time.
    v_new, d_new = [], []
    for _ in range(new_lengths):
        saved = snapshot(cache, target.delta_taps)
        tic = time.perf_counter()
        logits, features = target.forward(block_in, cache, flush=True)
        mx.eval(mx.argmax(logits, axis=-1))
        v_new.append((time.perf_counter() - tic) * 1e3)
        rollback(cache, target.delta_taps, saved, verified=block, kept=1)
        sink.commit([anchor], None if features is None else features[:, :1])
        if has_draft:
            tic = time.perf_counter()
            draft()
            d_new.append((time.perf_counter() - tic) * 1e3)
    out["verify_new_len_ms"] = summarize(v_new)["median"]
    out["draft_new_len_ms"] = summarize(d_new)["median"] if d_new else 0.0
    cache.clear()  # the caches go before clear_cache (the closures hold the list)
    mx.clear_cache()
    return out


class _NullDrafter:
    capture_layers = ()

    def start(self, prompt):
        pass

    def commit(self, tokens, features):
        pass
