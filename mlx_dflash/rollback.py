"""Exact cache rollback after a partially accepted verify pass.

After verifying S positions and keeping the first n, every target cache must
equal what plain autoregressive decoding of those n tokens would have built.

- KV caches (`KVCache`, `QuantizedKVCache`): `trim` moves the offset back.
- GatedDeltaNet (`ArraysCache` of [conv state, recurrent state]) cannot be
  trimmed, so we keep the pre-verify state and re-run the stock recurrence
  (`gated_delta_update`) over the n kept steps, from the inputs the verify pass
  produced (captured by the `Tap`s on conv1d / in_proj_a / in_proj_b). The
  conv state is the last K-1 raw inputs of [old conv state; kept inputs].
  The replay uses the same recurrence as the verify pass: mlx_lm's Metal kernel
  on Apple GPUs, our CUDA kernel (gdn.py) on NVIDIA, the ops path on CPU.

A batch (batch.py, ragged.py's caches) verifies the same S positions in every
row and keeps a different number per row: `rollback_rows` moves each row's KV
length back and replays every row's recurrence at once, masked past each
row's own kept steps (a masked step leaves the state as it was); `rollback_row`
rolls one row, taken out of the batch, further back.
"""

from typing import Any, Dict, List

import mlx.core as mx
import mlx.nn as nn

from .kernels.gdn import gated_delta, recurrence_inputs
from .target import DeltaTaps


def hold(delta_taps: Dict[int, DeltaTaps]) -> Dict[int, tuple]:
    """What the taps captured in the latest forward and the step states it
    kept, as references: `decode.prefill` puts them back when it is done
    (`put_back`), so that a batch row taken out part way through a cycle's
    tokens after another request's prefill still replays that cycle."""
    return {
        i: (
            [(t._capture.inputs, t._capture.outputs) for t in (d.conv, d.a, d.b)],
            getattr(getattr(d.layer, "step_states", None), "states", None),
        )
        for i, d in delta_taps.items()
    }


def put_back(delta_taps: Dict[int, DeltaTaps], held: Dict[int, tuple]):
    """The taps' captures and step states as `hold` found them."""
    for i, d in delta_taps.items():
        captures, states = held[i]
        for t, (inputs, outputs) in zip((d.conv, d.a, d.b), captures):
            t._capture.inputs, t._capture.outputs = inputs, outputs
        steps = getattr(d.layer, "step_states", None)
        if steps is not None:
            steps.states = states


def snapshot(cache: List[Any], delta_taps: Dict[int, DeltaTaps]) -> Dict[int, tuple]:
    """Reference the pre-verify recurrent states (arrays are immutable: no copy)."""
    return {i: cache[i][1] for i in delta_taps}


def rollback(
    cache: List[Any],
    delta_taps: Dict[int, DeltaTaps],
    saved: Dict[int, mx.array],
    *,
    verified: int,
    kept: int,
):
    """Make `cache` hold only the first `kept` of the `verified` positions."""
    assert 0 <= kept <= verified
    drop = verified - kept
    if drop == 0:
        return
    for i, c in enumerate(cache):
        if i in delta_taps:
            _replay_delta(delta_taps[i], c, saved[i], kept, verified)
        else:
            assert c.is_trimmable(), f"cache {i} ({type(c).__name__}) cannot trim"
            c.trim(drop)


def rollback_row(
    cache: List[Any],
    delta_taps: Dict[int, DeltaTaps],
    saved: Dict[int, mx.array],
    *,
    row: int,
    verified: int,
    held: int,
    kept: int,
):
    """Row `row` of a batch's latest verify, taken out as the one-row `cache`
    holding `held` of its `verified` positions, keeps only `kept` of them
    (a caller that stopped part way through the row's tokens)."""
    assert 0 <= kept <= held <= verified
    if kept == held:
        return
    rows = slice(row, row + 1)
    for i, c in enumerate(cache):
        if i in delta_taps:
            _replay_delta(delta_taps[i], c, saved[i][rows], kept, verified, rows)
        else:
            c.trim(held - kept)


def _replay_delta(
    taps: DeltaTaps, c, state0: mx.array, n: int, verified: int, rows=slice(None)
):
    """`rows`: the batch rows of the captures that `c` holds (all of them)."""
    la = taps.layer
    conv_in = taps.conv._capture.inputs[rows]  # [old conv state ; verify inputs]
    k1 = la.conv_kernel_size - 1
    c[0] = mx.contiguous(conv_in[:, n : n + k1])

    # The CUDA verify kernel kept the state after every step: pick, no replay.
    steps = getattr(la, "step_states", None)
    kept_states = None if steps is None else steps.states
    if steps is not None:
        steps.states = None
    if n == 0:  # the whole pass is undone (a stop met inside a pipelined run)
        c[1] = state0
        return
    if kept_states is not None and len(kept_states) == verified:
        c[1] = kept_states[n - 1][rows]
        return

    c[1] = _recur(taps, rows, n, state0, None, steps)


def _recur(taps: DeltaTaps, rows, n: int, state0, mask, steps):
    """The recurrence over the first `n` verified steps of the captures'
    `rows`, from `state0`; `mask` (rows, n) leaves a row's later steps out."""
    la = taps.layer
    q, k, v = recurrence_inputs(la, nn.silu(taps.conv._capture.outputs[rows, :n]))
    _, state = gated_delta(
        q,
        k,
        v,
        taps.a._capture.outputs[rows, :n],
        taps.b._capture.outputs[rows, :n],
        la.A_log,
        la.dt_bias,
        state0,
        mask,
        use_kernel=not la.training,
        ops=None if steps is None else steps.ops,
    )
    return state


def rollback_rows(
    cache: List[Any],
    delta_taps: Dict[int, DeltaTaps],
    saved: Dict[int, mx.array],
    *,
    verified: int,
    kept: List[int],
):
    """A batch's `rollback` (ragged.py's caches): row b keeps only the first
    kept[b] of the `verified` positions every row ran."""
    assert all(0 <= k <= verified for k in kept)
    drops = [verified - k for k in kept]
    if not any(drops):
        return
    for i, c in enumerate(cache):
        if i in delta_taps:
            _replay_delta_rows(delta_taps[i], c, saved[i], kept, verified)
        else:
            c.trim_rows(drops)


def _replay_delta_rows(taps: DeltaTaps, c, state0, kept: List[int], verified: int):
    la = taps.layer
    n = mx.array(kept)
    conv_in = taps.conv._capture.inputs  # (B, K-1+verified, C)
    k1 = la.conv_kernel_size - 1
    cols = (n[:, None] + mx.arange(k1))[..., None]
    c[0] = mx.take_along_axis(conv_in, cols, axis=1)

    steps = getattr(la, "step_states", None)
    kept_states = None if steps is None else steps.states
    if steps is not None:
        steps.states = None
    longest = max(kept)
    if longest == 0:
        c[1] = state0
        return
    if kept_states is not None and len(kept_states) == verified:
        # Each row's state after its own last kept step (the pre-verify one at 0).
        every = mx.concatenate([state0[None], kept_states])
        c[1] = mx.stack([every[k, b] for b, k in enumerate(kept)])
        return

    # One replay of the longest kept run; a row's later steps are masked,
    # which leaves its state as it was after its own last kept step.
    mask = mx.arange(longest)[None] < n[:, None]
    c[1] = _recur(taps, slice(None), longest, state0, mask, steps)
