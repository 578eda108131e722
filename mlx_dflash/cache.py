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


class BucketKVCache(KVCache):
    step = 256

    def capacity_for(self, n: int) -> int:
        cap = 0 if self.keys is None else self.keys.shape[2]
        need = self.offset + n
        return cap if need <= cap else -(-need // self.step) * self.step

    def update_and_fetch(self, keys, values):
        prev, n = self.offset, keys.shape[2]
        cap = self.capacity_for(n)
        if self.keys is None or cap > self.keys.shape[2]:
            B, H, _, Dk = keys.shape
            new_k = mx.zeros((B, H, cap, Dk), keys.dtype)
            new_v = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
            if self.keys is not None:
                new_k[..., :prev, :] = self.keys[..., :prev, :]
                new_v[..., :prev, :] = self.values[..., :prev, :]
            self.keys, self.values = new_k, new_v
        self.keys[..., prev : prev + n, :] = keys
        self.values[..., prev : prev + n, :] = values
        self.offset += n
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        """Causal mask over the whole (padded) buffer the next update returns."""
        if window_size is not None:
            raise ValueError("BucketKVCache does not support sliding windows")
        return bucket_mask(N, self.offset, self.capacity_for(N))


def bucket_mask(n: int, offset: int, capacity: int) -> mx.array:
    """(n, capacity) bool: query i (at offset+i) sees keys 0 .. offset+i."""
    q = mx.arange(offset, offset + n)[:, None]
    k = mx.arange(capacity)[None]
    return k <= q
