"""Caches of rows of different lengths, decoded together in one forward.

A batched verify runs B rows whose contexts differ in length and whose cycles
keep different numbers of positions. `RaggedKVCache` keeps each attention
layer's K/V right-padded in one buffer: row b's keys are columns
0 .. lengths[b]-1, a forward of N tokens writes row b's at lengths[b] ..
lengths[b]+N-1 (one scatter), RoPE takes the per-row `offset` array (as
mlx_lm's `BatchKVCache` has it), and the mask shows query i of row b the keys
0 .. lengths[b]+i (the offsets and write columns built once per forward for
all layers: `Positions`). Rolling a row back only lowers its length: the stale
columns stay hidden until a later write covers them. GatedDeltaNet layers keep
mlx_lm's `ArraysCache` with one row per request (rollback.py rolls those back
per row). `RaggedCache` is the list of them a model takes as `cache=`, plus
the rows joining (from a one-row cache, after its own prefill) and leaving.
Nothing in mlx_lm is patched.
"""

from typing import Any, List, Sequence

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from .cache import BucketKVCache, additive


class Positions:
    """The rows' lengths as arrays, shared by a batch's attention layers: each
    layer of a forward writes the same columns and reads the same offsets, so
    they are built once per forward, not once per layer (each layer's own made
    some 8 graph nodes and an upload; a verify is host-bound on MLX CUDA)."""

    KEEP = 8  # entries: a forward asks for two lengths (before, after)

    def __init__(self):
        self._kept = {}

    def _get(self, lengths: List[int], key, make):
        key = (tuple(lengths), key)
        got = self._kept.get(key)
        if got is None:
            if len(self._kept) >= self.KEEP:
                self._kept.clear()
            got = self._kept[key] = make()
        return got

    def offset(self, lengths: List[int]) -> mx.array:
        """(B,) int32: each row's length."""
        return self._get(lengths, "offset", lambda: mx.array(lengths, mx.int32))

    def columns(self, lengths: List[int], n: int, shape) -> mx.array:
        """Where each row's `n` new positions go, broadcast to `shape` (B, H, n, D)."""

        def make():
            cols = (self.offset(lengths)[:, None] + mx.arange(n))[:, None, :, None]
            return mx.broadcast_to(cols, shape)

        return self._get(lengths, (n, tuple(shape)), make)


class RaggedKVCache:
    """One attention layer's K/V for B rows of their own lengths (see above);
    `positions` shared with the batch's other layers (RaggedCache's)."""

    step = 256

    def __init__(self, positions: Positions = None):
        self.keys = self.values = None
        self.positions = positions or Positions()
        self.lengths: List[int] = []
        self.offset = mx.array([], mx.int32)
        self.kind = KVCache  # the one-row caches' class (`row` makes one)

    def _set_lengths(self, lengths: List[int]):
        self.lengths = list(lengths)
        self.offset = self.positions.offset(self.lengths)

    def capacity_for(self, n: int) -> int:
        """The buffer length once every row has `n` more positions."""
        cap = 0 if self.keys is None else self.keys.shape[2]
        need = max(self.lengths, default=0) + n
        return cap if need <= cap else -(-need // self.step) * self.step

    def _grow(self, cap: int):
        pad = cap - self.keys.shape[2]
        if pad > 0:
            widths = [(0, 0), (0, 0), (0, pad), (0, 0)]
            self.keys = mx.pad(self.keys, widths)
            self.values = mx.pad(self.values, widths)

    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        self._grow(self.capacity_for(n))
        cols = self.positions.columns
        self.keys = mx.put_along_axis(
            self.keys, cols(self.lengths, n, keys.shape), keys, axis=2
        )
        self.values = mx.put_along_axis(
            self.values, cols(self.lengths, n, values.shape), values, axis=2
        )
        self._set_lengths([l + n for l in self.lengths])
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        """(B, 1, N, capacity): query i of row b sees keys 0 .. lengths[b]+i."""
        if window_size is not None:
            raise ValueError("RaggedKVCache does not support sliding windows")
        q = self.offset[:, None, None, None] + mx.arange(N)[:, None]
        mask = mx.arange(self.capacity_for(N)) <= q
        return mask if self.keys is None else additive(mask, self.keys.dtype)

    def trim_rows(self, drops: Sequence[int]):
        """Row b forgets its last drops[b] positions."""
        assert all(0 <= d <= l for d, l in zip(drops, self.lengths))
        self._set_lengths([l - d for l, d in zip(self.lengths, drops)])

    def add(self, kv: KVCache):
        """A one-row cache's positions become a new last row."""
        n = kv.offset
        k, v = kv.keys[..., :n, :], kv.values[..., :n, :]
        self.kind = type(kv)
        if self.keys is None:
            self.keys, self.values = k[:0, :, :0], v[:0, :, :0]
        cap = max(self.keys.shape[2], -(-n // self.step) * self.step)
        self._grow(cap)
        widths = [(0, 0), (0, 0), (0, cap - n), (0, 0)]
        self.keys = mx.concatenate([self.keys, mx.pad(k, widths)])
        self.values = mx.concatenate([self.values, mx.pad(v, widths)])
        self._set_lengths(self.lengths + [n])

    def keep(self, rows: List[int]):
        self.keys, self.values = self.keys[mx.array(rows)], self.values[mx.array(rows)]
        self._set_lengths([self.lengths[r] for r in rows])

    def row(self, b: int) -> KVCache:
        """Row b as a one-row cache of the class it came in as (a copy): a
        `KVCache` of exactly its keys, a `BucketKVCache` over the whole
        (bucket-sized) buffer."""
        kv = self.kind()
        n = self.lengths[b]
        end = self.keys.shape[2] if isinstance(kv, BucketKVCache) else n
        kv.keys = mx.contiguous(self.keys[b : b + 1, :, :end])
        kv.values = mx.contiguous(self.values[b : b + 1, :, :end])
        kv.offset = n
        return kv

    @property
    def state(self):
        return self.keys, self.values, self.offset

    @property
    def nbytes(self):
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class RaggedCache:
    """A batch's caches: `layers` (one entry per model layer, what the model
    gets as `cache=`), `RaggedKVCache` where a one-row cache has a `KVCache`
    and an `ArraysCache` of B rows where it has one."""

    def __init__(self):
        self.layers: List[Any] = []
        self.rows = 0
        self.positions = Positions()  # the attention layers'

    def add(self, solo: List[Any]):
        """A one-row cache list (the model's own kinds) becomes row `rows`."""
        if not self.layers:
            for c in solo:
                if type(c) is ArraysCache:
                    self.layers.append(ArraysCache(len(c.cache)))
                elif isinstance(c, KVCache) and not hasattr(c, "bits"):
                    self.layers.append(RaggedKVCache(self.positions))
                else:
                    raise ValueError(
                        f"cache type {type(c).__name__} cannot be batched"
                    )
        for mine, c in zip(self.layers, solo):
            if isinstance(mine, RaggedKVCache):
                mine.add(c)
            else:
                mine.cache = [
                    x if self.rows == 0 else mx.concatenate([m, x])
                    for m, x in zip(mine.cache, c.cache)
                ]
        self.rows += 1

    def keep(self, rows: List[int]):
        """Only `rows` (indices, in this order) stay."""
        if not rows:
            self.layers, self.rows = [], 0
            return
        idx = mx.array(rows)
        for c in self.layers:
            if isinstance(c, RaggedKVCache):
                c.keep(rows)
            else:
                c.cache = [x[idx] for x in c.cache]
        self.rows = len(rows)

    def row(self, b: int) -> List[Any]:
        """Row b as a one-row cache list of the model's own kinds (a copy)."""
        return [self.row_layer(i, b) for i in range(len(self.layers))]

    def row_layer(self, i: int, b: int):
        """Layer i of row b as a one-row cache of the model's own kind (a copy)."""
        c = self.layers[i]
        if isinstance(c, RaggedKVCache):
            return c.row(b)
        a = ArraysCache(len(c.cache))
        a.cache = [mx.contiguous(x[b : b + 1]) for x in c.cache]
        return a

    def lengths(self) -> List[int]:
        for c in self.layers:
            if isinstance(c, RaggedKVCache):
                return list(c.lengths)
        return []
