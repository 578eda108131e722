"""A KV cache whose attention shapes change once per 256 tokens, not every step.

On MLX CUDA, `scaled_dot_product_attention` with several queries JIT-compiles
for every new key length (~50 ms, measured; DESIGN §4), and a verify loop's key
length grows every cycle. `BucketKVCache` keeps its buffer a multiple of `step`
long and hands attention the whole buffer plus an explicit boolean mask that
hides the unused tail, so a new kernel is built only when a bucket fills.
The visible keys and the causal order are the same as `KVCache`'s; rollback is
still `trim` (it only moves `offset`). It is a subclass passed in via
`cache=`; nothing in mlx_lm is patched.
"""

import mlx.core as mx
from mlx_lm.models.cache import KVCache

# The largest input that is a verify or draft block (anchor + drafted tokens):
# bucketed attention, the block kernels and GatedDeltaNet step states take
# inputs of 2 .. MAX_BLOCK rows; longer ones are prefill chunks.
MAX_BLOCK = 64


class BucketKVCache(KVCache):
    step = 256
    # Longer inputs (prefill chunks) get the exact keys and mlx_lm's "causal"
    # mask: the fused causal kernel, no (n x capacity) mask array; they are
    # few, so their per-length compiles do not matter. One-token inputs (plain
    # steps) get exact keys and no mask, as stock decoding does: the one-query
    # kernel takes any key length without a compile.
    max_bucketed = MAX_BLOCK

    def bucketed(self, n: int) -> bool:
        return 1 < n <= self.max_bucketed

    def capacity_for(self, n: int) -> int:
        cap = 0 if self.keys is None else self.keys.shape[2]
        need = self.offset + n
        return cap if need <= cap else -(-need // self.step) * self.step

    def reserve(self, n: int, keys=None, values=None):
        """Grow the buffers to the bucket that holds `n` more positions (their
        head counts, sizes and dtypes from `keys`, `values` before the first
        write)."""
        cap = self.capacity_for(n)
        if self.keys is not None and cap <= self.keys.shape[2]:
            return
        ref_k = keys if self.keys is None else self.keys
        ref_v = values if self.keys is None else self.values
        B, H, _, Dk = ref_k.shape
        new_k = mx.zeros((B, H, cap, Dk), ref_k.dtype)
        new_v = mx.zeros((B, H, cap, ref_v.shape[3]), ref_v.dtype)
        if self.keys is not None:
            prev = self.offset
            new_k[..., :prev, :] = self.keys[..., :prev, :]
            new_v[..., :prev, :] = self.values[..., :prev, :]
        self.keys, self.values = new_k, new_v

    def update_and_fetch(self, keys, values):
        prev, n = self.offset, keys.shape[2]
        self.reserve(n, keys, values)
        self.keys[..., prev : prev + n, :] = keys
        self.values[..., prev : prev + n, :] = values
        self.offset += n
        if not self.bucketed(n):
            return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        """Causal mask over the whole (padded) buffer the next update returns."""
        if window_size is not None:
            raise ValueError("BucketKVCache does not support sliding windows")
        if not self.bucketed(N):
            return super().make_mask(N, return_array=return_array, window_size=None)
        mask = bucket_mask(N, self.offset, self.capacity_for(N))
        if self.keys is None:
            return mask
        # Additive, in the cache's dtype: a boolean one MLX converts again in
        # every layer's attention call (one more graph node per layer).
        return additive(mask, self.keys.dtype)


def bucket_mask(n: int, offset: int, capacity: int) -> mx.array:
    """(n, capacity) bool: query i (at offset+i) sees keys 0 .. offset+i."""
    q = mx.arange(offset, offset + n)[:, None]
    k = mx.arange(capacity)[None]
    return k <= q


def additive(mask: mx.array, dtype) -> mx.array:
    """A boolean mask as 0 (visible) / -inf (hidden) in `dtype`."""
    return mx.where(mask, mx.array(0, dtype), mx.array(-mx.inf, dtype))


class PaddedBatchKVCache(KVCache):
    """Rows of left-padded prompts decoded together in one preallocated buffer.

    Every call attends over the whole buffer (`capacity` keys, fixed up front)
    with a mask that hides each row's left padding and the unwritten tail, so a
    decode loop shows attention one shape from start to end (on MLX CUDA a new
    key length is a new kernel, DESIGN §4). `offset` holds each row's position
    of the next token, as in mlx_lm's `BatchKVCache`, so RoPE sees the same
    positions as an unpadded run. Passed in via `cache=`; mlx_lm is unchanged.
    """

    def __init__(self, left_padding: mx.array, capacity: int):
        super().__init__()
        self.left_padding = left_padding
        self.capacity = capacity
        self.idx = 0  # next buffer column; the same for every row
        self.offset = -left_padding

    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        assert self.idx + n <= self.capacity, "PaddedBatchKVCache is full"
        if self.keys is None:
            B, H, _, Dk = keys.shape
            self.keys = mx.zeros((B, H, self.capacity, Dk), keys.dtype)
            self.values = mx.zeros((B, H, self.capacity, values.shape[3]), values.dtype)
        self.keys[..., self.idx : self.idx + n, :] = keys
        self.values[..., self.idx : self.idx + n, :] = values
        self.idx += n
        self.offset = self.offset + n
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        """(rows, 1, N, capacity) bool: causal, minus each row's left padding."""
        if window_size is not None:
            raise ValueError("PaddedBatchKVCache does not support sliding windows")
        q = mx.arange(self.idx, self.idx + N)[:, None]
        k = mx.arange(self.capacity)[None]
        real = k[None] >= self.left_padding[:, None, None]
        # A padding query still sees itself: a row with no visible key would
        # make a NaN that reaches every row through 0 * NaN in the values.
        return ((k <= q) & real | (k == q))[:, None]

    def filter(self, rows: mx.array):
        """Keep only `rows` (indices into the batch), in that order."""
        self.keys, self.values = self.keys[rows], self.values[rows]
        self.left_padding, self.offset = self.left_padding[rows], self.offset[rows]
