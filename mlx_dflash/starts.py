"""Starting device work early, and several rows' starts as one.

A cycle starts what the next one needs (the draft, a drafter's context K/V)
with `mx.async_eval`, so the device works while the host goes on. Each call
encodes and launches everything then pending; a batch (batch.py) whose rows
each started their own work paid that once per row per cycle. Inside
`together()`, `start_eval` only collects, and one call at its end starts it all.
"""

from contextlib import contextmanager
from typing import List, Optional

import mlx.core as mx

_held: Optional[List[mx.array]] = None  # inside `together()`: what waits


def start_eval(arrays: List[mx.array]) -> None:
    """Evaluate `arrays` asynchronously: now, or at the end of `together()`."""
    if _held is None:
        mx.async_eval(arrays)
    else:
        _held.extend(arrays)


@contextmanager
def together():
    """The `start_eval`s made inside as one `mx.async_eval` at the end."""
    global _held
    outer, _held = _held, []
    try:
        yield
        held = _held
    finally:
        _held = outer
    if held:
        start_eval(held)
