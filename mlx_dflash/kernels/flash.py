"""A verify or draft block's attention on CUDA in three kernel launches.

Between a mirrored layer's q/k/v products and its o_proj, mlx_lm's attention
is some 15 graph nodes per layer (reshapes, per-head norms, transposes, RoPE,
the cache writes, attention, the output's transpose and reshape), and every node
costs the host ~9 µs on MLX CUDA (bench/results/speed.md §9) while a verify
block's attention itself is a few µs of device work. Here it is:

1. `norm_rope`: q and k's per-head RMSNorm and RoPE, and the layout (heads
   first) the cache takes, in one launch (v only changes layout);
2. the cache writes (MLX's two in-place slice updates);
3. `attention`: split-K flash attention of the block's queries over the cache's
   first `offset + L` keys, causal (a verify) or not (a draft), with tensor-core
   `mma.sync` (bf16/fp16 in, fp32 scores, softmax and accumulation), then one
   launch that merges the key splits and writes o_proj's input rows.

`attend` runs the three for a layer (layer.py's verify and draft blocks,
attention.py's wrapper), through a backend (cuda.py's, or a test's ops
stand-in) for steps 1 and 3. Only the valid keys are read (not the bucket's
padding), and long contexts are split over the GPU's SMs, which MLX's masked
attention does not do for a block. Step 1 is rope.py's.
"""

import math
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import mlx.nn as nn

from ..cache import BucketKVCache
from .mma import header

CHUNK = 64  # keys per shared-memory tile
MAX_ROWS = 128  # query rows per KV head (repeats x block length): 8 warps
SPLIT_BLOCKS = 264  # aim for two thread blocks per SM of an H200 (132 SMs)

_kernels = {}

_NEG_INF = "#define NEG_INF __int_as_float(0xff800000)\n"

_PACK = """
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  T h[2] = {static_cast<T>(lo), static_cast<T>(hi)};
  return *reinterpret_cast<unsigned*>(h);
}
template <typename T>
__device__ __forceinline__ unsigned pack2(T lo, T hi) {
  T h[2] = {lo, hi};
  return *reinterpret_cast<unsigned*>(h);
}
"""

# Thread block (split, kv head); warp w takes query rows w*16 .. w*16+15 of the
# REP * L rows that share the KV head (row r: head hk*REP + r / L, position
# r % L). Scores are kept in the log2 domain (scaled by scale * log2 e).
# Fragments of m16n8k16 (g = lane / 4, t = lane % 4): A rows g, g+8 and k
# 2t, 2t+1, 2t+8, 2t+9; B column g, same k; C rows g, g+8, columns 2t, 2t+1.
_FLASH = """
  constexpr int KS = D / 16, NT = CHUNK / 8, DT = D / 8, PAD = D + 8;
  __shared__ __align__(16) T ks[CHUNK][PAD];
  __shared__ __align__(16) T vs[CHUNK][PAD];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int S = off[1], L = q_shape[2], C = kc_shape[2];  // S: po's splits
  const int split = blockIdx.x % S, hk = blockIdx.x / S;
  const int R = REP * L, n_keys = off[0] + L;
  const int n_chunks = (n_keys + CHUNK - 1) / CHUNK;
  const int per = (n_chunks + S - 1) / S;
  const int c_begin = split * per, c_end = min(n_chunks, c_begin + per);

  const int rows[2] = {warp * 16 + g, warp * 16 + g + 8};
  int head[2], pos[2];
  unsigned qa[KS][4];
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = min(rows[h], R - 1);
    head[h] = hk * REP + r / L;
    pos[h] = r % L;
  }
  #pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      const T* qr = q + ((size_t)head[h] * L + pos[h]) * D + kk * 16 + 2 * t;
      qa[kk][h] = *reinterpret_cast<const unsigned*>(qr);
      qa[kk][h + 2] = *reinterpret_cast<const unsigned*>(qr + 8);
    }
  }
  const float sl2 = SCALE_LOG2E;
  float o[DT][4] = {};
  float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};

  for (int c = c_begin; c < c_end; ++c) {
    __syncthreads();
    const T* kb = kc + ((size_t)hk * C + (size_t)c * CHUNK) * D;
    const T* vb = vc + ((size_t)hk * C + (size_t)c * CHUNK) * D;
    for (int e = threadIdx.x; e < CHUNK * D / 8; e += blockDim.x) {
      const int row = e / (D / 8), col = (e % (D / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      // Keys past offset + L are masked, but 0 * NaN is NaN: never read them.
      if (c * CHUNK + row < min(C, n_keys)) {
        kv = *reinterpret_cast<const uint4*>(kb + (size_t)row * D + col);
        vv = *reinterpret_cast<const uint4*>(vb + (size_t)row * D + col);
      }
      *reinterpret_cast<uint4*>(&ks[row][col]) = kv;
      *reinterpret_cast<uint4*>(&vs[row][col]) = vv;
    }
    __syncthreads();

    float s[NT][4];
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      #pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const unsigned b0 = *reinterpret_cast<const unsigned*>(&ks[j * 8 + g][kk * 16 + 2 * t]);
        const unsigned b1 = *reinterpret_cast<const unsigned*>(&ks[j * 8 + g][kk * 16 + 8 + 2 * t]);
        mma16816(s[j], qa[kk], b0, b1);
      }
    }
    float cmax[2] = {NEG_INF, NEG_INF};
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, key = c * CHUNK + j * 8 + 2 * t + (e & 1);
        // CAUSAL: a verify block (query i sees keys up to offset + i); else a
        // draft block (every query sees the context and the whole block).
        const bool ok = rows[h] < R && (CAUSAL ? key <= off[0] + pos[h] : key < n_keys);
        s[j][e] = ok ? s[j][e] * sl2 : NEG_INF;
        cmax[h] = fmaxf(cmax[h], s[j][e]);
      }
    }
    float base[2], corr[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffff, cmax[h], 1));
      cmax[h] = fmaxf(cmax[h], __shfl_xor_sync(0xffffffff, cmax[h], 2));
      const float mn = fmaxf(m[h], cmax[h]);
      base[h] = mn == NEG_INF ? 0.0f : mn;
      corr[h] = exp2f(m[h] - base[h]);
      m[h] = mn;
      l[h] *= corr[h];
    }
    #pragma unroll
    for (int j = 0; j < NT; ++j) {
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - base[e >> 1]);
        l[e >> 1] += s[j][e];
      }
    }
    #pragma unroll
    for (int n = 0; n < DT; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    #pragma unroll
    for (int kk = 0; kk < CHUNK / 16; ++kk) {
      const unsigned pa[4] = {
          pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
          pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
          pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int k0 = kk * 16 + 2 * t;
      #pragma unroll
      for (int n = 0; n < DT; ++n) {
        const int col = n * 8 + g;
        const unsigned b0 = pack2<T>(vs[k0][col], vs[k0 + 1][col]);
        const unsigned b1 = pack2<T>(vs[k0 + 8][col], vs[k0 + 9][col]);
        mma16816(o[n], pa, b0, b1);
      }
    }
  }

  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    if (rows[h] >= R) continue;
    const size_t row = ((size_t)split * (HK * REP) + head[h]) * L + pos[h];
    #pragma unroll
    for (int n = 0; n < DT; ++n) {
      po[row * D + n * 8 + 2 * t] = o[n][2 * h];
      po[row * D + n * 8 + 2 * t + 1] = o[n][2 * h + 1];
    }
    if (t == 0) {
      pm[row] = m[h];
      pl[row] = l[h];
    }
  }
"""

# One thread block per (head, position), one thread per value of the head:
# the splits' partial sums merged by their maxima, written as o_proj's input
# row (position, head * D + d).
_MERGE = """
  const int S = po_shape[0], H = po_shape[1], L = po_shape[2];
  const int hrow = blockIdx.x, d = threadIdx.x;
  const int h = hrow / L, i = hrow % L;
  const size_t stride = (size_t)H * L;
  float mx = NEG_INF;
  for (int s = 0; s < S; ++s) mx = fmaxf(mx, pm[s * stride + hrow]);
  float num = 0.0f, den = 0.0f;
  for (int s = 0; s < S; ++s) {
    const float w = pm[s * stride + hrow] == NEG_INF ? 0.0f : exp2f(pm[s * stride + hrow] - mx);
    num += w * po[(s * stride + hrow) * D + d];
    den += w * pl[s * stride + hrow];
  }
  y[((size_t)i * H + h) * D + d] = static_cast<T>(num / den);
"""


def _flash_kernel(dtype, scale: float):
    key = ("flash", dtype, scale)
    if key not in _kernels:
        _kernels[key] = mx.fast.cuda_kernel(
            name=f"dflash_flash_{len(_kernels)}",
            input_names=["q", "kc", "vc", "off"],
            output_names=["po", "pm", "pl"],
            source=_FLASH.replace("SCALE_LOG2E", f"{scale * math.log2(math.e)!r}f"),
            header=_NEG_INF + header(dtype) + _PACK,
        )
    return _kernels[key]


def _merge_kernel():
    if "merge" not in _kernels:
        _kernels["merge"] = mx.fast.cuda_kernel(
            name="dflash_flash_merge",
            input_names=["po", "pm", "pl"],
            output_names=["y"],
            source=_MERGE,
            header=_NEG_INF,
        )
    return _kernels["merge"]


@dataclass(frozen=True)
class Params:
    """What a layer's attention block needs besides arrays (not a tuple: an
    nn.Module would take a tuple attribute for part of its parameter tree)."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: Optional[float]  # of q_norm and k_norm; None: no per-head norms
    base: float  # RoPE
    rope_scale: float
    scale: float  # of the attention scores


def params(a: nn.Module) -> Optional[Params]:
    """Mirrored attention layer `a`'s `Params`, or None where these kernels do
    not take it (RoPE other than plain `nn.RoPE` over the whole head, norms
    other than RMSNorm with one eps)."""
    heads, kv_heads = a.n_heads, a.n_kv_heads
    d = a.q_proj.weight.shape[0] // heads
    rope = a.rope
    norms = [a[k] for k in ("q_norm", "k_norm") if k in a]
    if not (
        heads % kv_heads == 0
        and type(rope) is nn.RoPE
        and not rope.traditional
        and rope.dims == d
        and len(norms) in (0, 2)
        and all(type(nm) is nn.RMSNorm and nm.weight.shape == (d,) for nm in norms)
        and len({float(nm.eps) for nm in norms}) <= 1
    ):
        return None
    eps = float(norms[0].eps) if norms else None
    return Params(
        heads, kv_heads, d, eps, float(rope.base), float(rope.scale), float(a.scale)
    )


def applies(p: Optional[Params], x: mx.array, cache) -> bool:
    """Whether a block `x` (B, L, ·) of a layer with `params` p over `cache`
    takes these kernels (else the ops path)."""
    if p is None or mx.default_device() != mx.gpu:
        return False
    B, L = x.shape[0], x.shape[1]
    return (
        B == 1
        and p.head_dim in (64, 128)
        and x.dtype in (mx.bfloat16, mx.float16)
        and isinstance(cache, BucketKVCache)
        and cache.bucketed(L)
        and cache.keys is not None
        and cache.keys.dtype == x.dtype
        and p.heads // p.kv_heads * L <= MAX_ROWS
    )


def splits(n_keys: int, kv_heads: int) -> int:
    """Key splits per KV head for up to `n_keys` keys: every split gets at
    least one chunk, and the grid about SPLIT_BLOCKS thread blocks."""
    chunks = -(-n_keys // CHUNK)
    per = -(-chunks // max(1, SPLIT_BLOCKS // kv_heads))
    return -(-chunks // per)


def attention(
    q: mx.array, keys: mx.array, values: mx.array, off, scale: float, causal=True
):
    """softmax(scale q kᵀ) v for q (1, H, L, D) at positions off[0] ..
    off[0] + L - 1 over the first off[0] + L keys of the cache buffers
    (1, Hk, C, D), causal or not, the keys split off[1] ways (`splits`; a
    split past the last key is empty); returns (1, L, H * D), o_proj's input."""
    _, heads, L, d = q.shape
    kv_heads = keys.shape[1]
    rep = heads // kv_heads
    s = splits(keys.shape[2], kv_heads)
    warps = -(-rep * L // 16)
    po, pm, pl = _flash_kernel(q.dtype, float(scale))(
        inputs=[q, keys, values, off],
        template=[
            ("T", q.dtype),
            ("D", d),
            ("REP", rep),
            ("HK", kv_heads),
            ("CHUNK", CHUNK),
            ("CAUSAL", bool(causal)),
        ],
        grid=(s * kv_heads * 32 * warps, 1, 1),
        threadgroup=(32 * warps, 1, 1),
        output_shapes=[(s, heads, L, d), (s, heads, L), (s, heads, L)],
        output_dtypes=[mx.float32] * 3,
    )
    return _merge_kernel()(
        inputs=[po, pm, pl],
        template=[("T", q.dtype), ("D", d)],
        grid=(heads * L * d, 1, 1),
        threadgroup=(d, 1, 1),
        output_shapes=[(1, L, heads * d)],
        output_dtypes=[q.dtype],
    )[0]


def offsets(offset: int, keys: mx.array) -> mx.array:
    """The kernels' `off` input for a block at `offset` over cache buffers
    `keys`: [offset, key splits] (`attention` splits the buffer's capacity;
    splits past the block's last key are empty)."""
    return mx.array([offset, splits(keys.shape[2], keys.shape[1])], mx.int32)


def attend(ops, p: Params, q, k, v, cache, norms=None, causal=True, advance=True):
    """A layer's attention of a block from its q/k/v rows (1, L, ·) with its
    per-head q/k `norms` (weights; None if p has none) over `cache` (a
    `BucketKVCache`), which it updates as `update_and_fetch` would;
    without `advance` the block's keys only sit past the cache's offset, for
    the next write to replace (a draft block, which is not context). Returns
    o_proj's input (1, L, H * D). `ops` (the backend) runs `norm_rope` and
    `attention`."""
    L, offset = q.shape[1], cache.offset
    cache.reserve(L)
    off = offsets(offset, cache.keys)
    qn, kn = norms if p.eps is not None else (None, None)
    q, k, v = ops.norm_rope(q, k, v, qn, kn, off, p)
    # Static slices: MLX updates the buffer in place. (`mx.slice_update` with
    # an array start copied it whole: +5 ms per verify at 16k, speed.md §11.)
    cache.keys[..., offset : offset + L, :] = k
    cache.values[..., offset : offset + L, :] = v
    if advance:
        cache.offset += L
    return ops.attention(q, cache.keys, cache.values, off, p.scale, causal)
