"""Per-head RMSNorm and RoPE of a block's q and k, in one CUDA launch.

The first of flash.py's three steps: q and k of a verify or draft block go
through their per-head norms (where the layer has them) and RoPE, and q, k and
v into the heads-first layout the cache takes, in one launch where mlx_lm
spends some ten graph nodes. Rounding follows stock: the norm's output and
RoPE's are rounded to the input dtype as `mx.fast.rms_norm` and
`mx.fast.rope` round them.
"""

import math

import mlx.core as mx

_kernels = {}

# One warp per (row, head) of q, k and v: D / 32 values per lane, lane l holding
# l, l + 32, ...; RoPE (not traditional) pairs value e with e + D / 2, so both
# halves of a pair are in one lane.
_NORM_ROPE = """
  const int lane = threadIdx.x & 31;
  const int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  int L = 1;
  for (int i = 0; i < q_ndim - 1; ++i) L *= q_shape[i];
  if (w >= L * (H + 2 * HK)) return;
  const int i = w / (H + 2 * HK), s = w % (H + 2 * HK);
  constexpr int E = D / 32;
  const T* src;
  T* dst;
  const T* nw = nullptr;
  if (s < H) {
    src = q + ((size_t)i * H + s) * D;
    dst = qo + ((size_t)s * L + i) * D;
    nw = qn;
  } else if (s < H + HK) {
    src = k + ((size_t)i * HK + (s - H)) * D;
    dst = ko + ((size_t)(s - H) * L + i) * D;
    nw = kn;
  } else {
    src = v + ((size_t)i * HK + (s - H - HK)) * D;
    dst = vo + ((size_t)(s - H - HK) * L + i) * D;
  }
  float x[E];
  #pragma unroll
  for (int e = 0; e < E; ++e) x[e] = static_cast<float>(src[lane + 32 * e]);
  if (s < H + HK) {
    if (NORM) {
      float ss = 0.0f;
      #pragma unroll
      for (int e = 0; e < E; ++e) ss += x[e] * x[e];
      #pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
      const float inv = rsqrtf(ss / D + EPS);
      #pragma unroll
      for (int e = 0; e < E; ++e)
        x[e] = static_cast<float>(nw[lane + 32 * e] * static_cast<T>(x[e] * inv));
    }
    const float pos = SCALE * static_cast<float>(off[0] + i);
    #pragma unroll
    for (int e = 0; e < E / 2; ++e) {
      const float d = static_cast<float>(lane + 32 * e) / static_cast<float>(D / 2);
      const float theta = pos * exp2f(-d * LOG2BASE);
      const float c = cosf(theta), sn = sinf(theta);
      const float x1 = x[e], x2 = x[e + E / 2];
      x[e] = static_cast<float>(static_cast<T>(x1 * c - x2 * sn));
      x[e + E / 2] = static_cast<float>(static_cast<T>(x1 * sn + x2 * c));
    }
  }
  #pragma unroll
  for (int e = 0; e < E; ++e) dst[lane + 32 * e] = static_cast<T>(x[e]);
"""


def _norm_rope_kernel(norm: bool, eps: float, log2base: float, scale: float):
    key = ("norm_rope", norm, eps, log2base, scale)
    if key not in _kernels:
        source = _NORM_ROPE
        for name, value in [
            ("NORM", "true" if norm else "false"),
            ("EPS", f"{eps!r}f"),
            ("LOG2BASE", f"{log2base!r}f"),
            ("SCALE", f"{scale!r}f"),
        ]:
            source = source.replace(name, value)
        _kernels[key] = mx.fast.cuda_kernel(
            name=f"dflash_norm_rope_{len(_kernels)}",
            input_names=["q", "k", "v", "qn", "kn", "off"],
            output_names=["qo", "ko", "vo"],
            source=source,
        )
    return _kernels[key]


def norm_rope(q, k, v, qn, kn, off, p):
    """(q, k, v) rows (B=1, L, heads * D) → (1, heads, L, D) each (`p`: the
    layer's flash.Params): q and k
    through the per-head norms `qn`, `kn` (weights; None if p has none) and
    RoPE at position off[0]."""
    L, d = q.shape[1], p.head_dim
    norm = p.eps is not None
    kernel = _norm_rope_kernel(
        norm, p.eps or 0.0, math.log2(p.base), float(p.rope_scale)
    )
    warps = L * (p.heads + 2 * p.kv_heads)
    return kernel(
        inputs=[q, k, v, qn if norm else q, kn if norm else q, off],  # q: unread
        template=[("T", q.dtype), ("D", d), ("H", p.heads), ("HK", p.kv_heads)],
        grid=(32 * warps, 1, 1),
        threadgroup=(128, 1, 1),
        output_shapes=[
            (1, p.heads, L, d),
            (1, p.kv_heads, L, d),
            (1, p.kv_heads, L, d),
        ],
        output_dtypes=[q.dtype] * 3,
    )
