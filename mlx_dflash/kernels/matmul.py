"""Products of verify- and draft-sized blocks of rows, as one CUDA kernel.

On MLX CUDA (0.32) a product with one row runs MLX's own gemv kernel, but any
other row count goes to cuBLASLt, and each such call rebuilds its descriptors,
reruns cuBLAS's heuristic and is captured into a child graph on the host
(mlx/backend/cuda/matmul.cpp). A 16-token verify of a Qwen3-8B shape makes 253
of them, so building its graph, not reading the weights, set its time. Here a
block of 2-64 rows is one plain kernel node: each warp streams a slice of the
weight rows once and multiplies it into every row of the block with tensor-core
`mma.sync` (bf16/fp16 in, fp32 accumulation, as cuBLAS does for these types).

Weights are bf16/fp16 matrices or MLX affine-quantized ones (`Packed`: 4 or 8
bits, groups of 32/64/128, as `nn.QuantizedLinear` holds them). A quantized
weight is dequantized in registers as it streams (scale * q + bias, rounded
to the input type, which is what `mx.dequantize` gives), so a 4-bit block
reads a quarter of the bytes and still runs one launch; MLX's own
`quantized_matmul` for 16 rows cost ~2.6x a one-token step (DESIGN §5).

The same kernel takes several weights in one launch (q/k/v: `block_matmuls`;
gate/up with SwiGLU: `block_swiglu`), an RMSNorm of its input, or a residual
added to its output, so that a decoder layer is four launches (layer.py).
The wrappers that call it (linear.py, layer.py, attention.py) reach it through
the CUDA backend (cuda.py); for shapes it does not tile they run the stock
product.
"""

import functools
import math
from typing import Any, List, NamedTuple, Optional, Sequence, Union

import mlx.core as mx
import mlx.nn as nn

from ..cache import MAX_BLOCK
from .mma import PTX_TYPE, header

MAX_ROWS = MAX_BLOCK  # 4 tiles of 16 rows; verify and draft blocks
WARPS = 8  # per block, splitting K (16 for one row tile where K allows)
K_CHUNK = 64  # K consumed by one warp step: 4 lanes x 16 values
COLS = 16  # output columns per block
BITS = (4, 8)  # affine-quantized weights the kernel dequantizes
GROUPS = (32, 64, 128)


class Packed(NamedTuple):
    """An affine-quantized weight as `nn.QuantizedLinear` (or a quantized
    embedding used as the head) holds it. `shape` and `dtype` are those of
    the matrix it stands for, so shape checks read the same for both kinds."""

    weight: mx.array  # uint32, (N, K * bits / 32)
    scales: mx.array  # (N, K / group_size), the input dtype
    biases: mx.array
    group_size: int
    bits: int

    @property
    def shape(self):
        return (self.weight.shape[0], self.weight.shape[1] * 32 // self.bits)

    @property
    def dtype(self):
        return self.scales.dtype

    @property
    def ndim(self):
        return 2


Weight = Union[mx.array, Packed]
QUANTIZED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


def weight_of(module: nn.Module) -> Weight:
    """The weight a (quantized) Linear or Embedding multiplies by."""
    if isinstance(module, QUANTIZED):
        return Packed(
            module["weight"],
            module["scales"],
            module["biases"],
            module.group_size,
            module.bits,
        )
    return module["weight"]


def blockable(module: nn.Module) -> bool:
    """Whether the kernel can take `module`'s product (shapes aside): a plain
    `nn.Linear`, or an affine `nn.QuantizedLinear` the kernel dequantizes."""
    if type(module) is nn.Linear:
        return True
    return (
        type(module) is nn.QuantizedLinear
        and getattr(module, "mode", "affine") == "affine"
        and module.bits in BITS
        and module.group_size in GROUPS
        and "biases" in module
    )


def dense(w: Weight, x: mx.array) -> mx.array:
    """`x @ w.T` with stock ops (what the kernel computes; for tests)."""
    if isinstance(w, Packed):
        return mx.quantized_matmul(
            x, w.weight, w.scales, w.biases, True, w.group_size, w.bits
        )
    return x @ w.T

# Grid: one block of 32 WARPS threads per NT tiles of 8 output columns (of
# each weight panel it reads); warp w takes K slice w. A lane (g = lane / 4,
# t = lane % 4) loads 16 consecutive k of weight row g of each tile and of block
# rows g, g + 8, and feeds them to 4 mma steps. The k order inside a step does
# not matter to a dot product, only that A and B agree, so this order lets
# every lane read 32 contiguous bytes (a weight row's 64 k by 4 lanes at once;
# 4 lanes reading 64 contiguous bytes per load instead measured slower, as did
# non-caching loads with an L2 prefetch hint: speed.md section 12).
# P panels: 1 (one weight per block; SELECT picks which of the group's weights
# from the block index) or 2 (gate and up at the same columns, for SwiGLU).
_SOURCE = """
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int K = x_shape[x_ndim - 1];
  int M = 1;
  for (int i = 0; i < x_ndim - 1; ++i) M *= x_shape[i];
  const int kper = K / WARPS;
  const int k_begin = warp * kper;
  int blk = blockIdx.x;
  WEIGHT_PTRS
  T* y;
  int N;
  SELECT
  const int n0 = blk * (8 * NT);

  float acc[P][MT][NT][4] = {};
  float ss[MT][2] = {};  // NORM: sums of squares of rows g, g + 8 (this lane's k)

  // Unrolled 4 deep so that each warp has 4 steps of weight loads in flight:
  // on the H200 a Qwen3-8B layer's four launches take 125 us, against 150 us
  // unrolled 2 (gate/up 84 -> 65 us; speed.md section 12).
  #pragma unroll 4
  for (int kc = k_begin; kc < k_begin + kper; kc += 64) {
    const int kk = kc + t * 16;
    uint4 wv[P][NT][2];  // 16 consecutive k of one weight row, as T
    #pragma unroll
    for (int p = 0; p < P; ++p) {
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const size_t wrow = n0 + j * 8 + g;
        WEIGHT_LOAD
      }
    }
    NORM_LOAD
    #pragma unroll
    for (int m = 0; m < MT; ++m) {
      const int r0 = m * 16 + g, r1 = r0 + 8;
      uint4 xa[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      uint4 xb[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (r0 < M) {
        const uint4* q = reinterpret_cast<const uint4*>(x + (size_t)r0 * K + kk);
        xa[0] = q[0];
        xa[1] = q[1];
      }
      if (r1 < M) {
        const uint4* q = reinterpret_cast<const uint4*>(x + (size_t)r1 * K + kk);
        xb[0] = q[0];
        xb[1] = q[1];
      }
      NORM_APPLY
      const unsigned* ua = reinterpret_cast<const unsigned*>(xa);
      const unsigned* ub = reinterpret_cast<const unsigned*>(xb);
      #pragma unroll
      for (int s = 0; s < 4; ++s) {
        const unsigned a[4] = {ua[2 * s], ub[2 * s], ua[2 * s + 1], ub[2 * s + 1]};
        #pragma unroll
        for (int p = 0; p < P; ++p) {
          #pragma unroll
          for (int j = 0; j < NT; ++j) {
            const unsigned* uw = reinterpret_cast<const unsigned*>(wv[p][j]);
            mma16816(acc[p][m][j], a, uw[2 * s], uw[2 * s + 1]);
          }
        }
      }
    }
  }

  // Sum the WARPS partial tiles through shared memory, one row tile at a time.
  __shared__ float part[P][WARPS][16][8 * NT];
  NORM_REDUCE
  #pragma unroll
  for (int m = 0; m < MT; ++m) {
    #pragma unroll
    for (int p = 0; p < P; ++p) {
      #pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int c = j * 8 + 2 * t;
        part[p][warp][g][c] = acc[p][m][j][0];
        part[p][warp][g][c + 1] = acc[p][m][j][1];
        part[p][warp][g + 8][c] = acc[p][m][j][2];
        part[p][warp][g + 8][c + 1] = acc[p][m][j][3];
      }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < 16 * 8 * NT; e += 32 * WARPS) {
      const int r = e / (8 * NT), c = e % (8 * NT);
      const int row = m * 16 + r, col = n0 + c;
      if (row < M) {
        float v[P];
        #pragma unroll
        for (int p = 0; p < P; ++p) {
          v[p] = 0.0f;
          for (int i = 0; i < WARPS; ++i) v[p] += part[p][i][r][c];
        }
        NORM_SCALE
        EPILOGUE
      }
    }
    __syncthreads();
  }
"""

# Weight rows as T (two 16-byte loads), or packed (QB bits a value, one scale
# and bias per GS values: a lane's 16 k lie in one group) dequantized here.
_DENSE_PTRS = "const T* wp[P];"
_DENSE_LOAD = """const uint4* q = reinterpret_cast<const uint4*>(wp[p] + wrow * K + kk);
        wv[p][j][0] = q[0];
        wv[p][j][1] = q[1];"""
_PACKED_PTRS = "const unsigned* wq[P]; const T* ws[P]; const T* wz[P];"
_PACKED_LOAD = """const size_t gi = wrow * (K / GS) + kk / GS;
        const float sc = static_cast<float>(ws[p][gi]);
        const float zb = static_cast<float>(wz[p][gi]);
        // 16 values of QB bits, lowest bits first, in one 8- or 16-byte load
        struct alignas(QB * 2) Words { unsigned w[QB / 2]; };
        const Words u = *reinterpret_cast<const Words*>(wq[p] + (wrow * K + kk) * QB / 32);
        T* tw = reinterpret_cast<T*>(wv[p][j]);
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
          const unsigned v = (u.w[i * QB / 32] >> ((i * QB) % 32)) & ((1u << QB) - 1u);
          tw[i] = static_cast<T>(fmaf(sc, static_cast<float>(v), zb));
        }"""

# 4 bits: each byte's two values become one T pair with integer ops (the
# value is the low mantissa bits of MAGIC's float, 128 in bf16 or 1024 in fp16,
# where steps are 1), then one paired subtract and one paired fma: no
# int/float conversions, which run at a quarter of the FMA rate and made the
# generic path's 4-bit verify slower than bf16's. One PRMT puts byte b of the
# word and of the word shifted by 4 in the pair's two halves, one LOP3 masks
# both nibbles and sets MAGIC's exponent: 4 instructions a pair against 6 with
# shifts and masks (nvcc sm_90: the 16 x 4 K loop 831 -> 674 instructions).
# Against the shift decode (Nsight Compute, one H100, 16 x 4, 16 rows): faster
# where a launch is issue-bound (q/k/v 18.7 vs 19.4 us, gate/up 44.4 vs 49.5),
# slower where it is latency-bound (o 18.5 vs 14.8, down 50.5 vs 39.4) and on
# the head (245.7 vs 234.5); bench/results/h100-ncu-linear4-variants-s39.csv.
# At the tilings `_packed4_one_tile` now gives o and down, the shift decode
# is untimed.
_PACKED4_LOAD = """const size_t gi = wrow * (K / GS) + kk / GS;
        PAIR s2, z2;
        s2.x = s2.y = ws[p][gi];
        z2.x = z2.y = wz[p][gi];
        const uint2 u = *reinterpret_cast<const uint2*>(wq[p] + (wrow * K + kk) / 8);
        const unsigned magic = MAGIC;
        const PAIR base = *reinterpret_cast<const PAIR*>(&magic);
        const unsigned hi[2] = {u.x >> 4, u.y >> 4};
        unsigned* tw = reinterpret_cast<unsigned*>(wv[p][j]);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
          const unsigned b = i & 3;
          const unsigned t = __byte_perm(i < 4 ? u.x : u.y, hi[i / 4], b | ((b + 4) << 8));
          unsigned h;  // (t & 0x000F000F) | magic, as one LOP3 (nvcc makes two)
          asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(h) : "r"(t), "r"(magic));
          PAIR v = __hfma2(__hsub2(*reinterpret_cast<PAIR*>(&h), base), s2, z2);
          tw[i] = *reinterpret_cast<unsigned*>(&v);
        }"""
_PAIR = {mx.bfloat16: ("__nv_bfloat162", "0x43004300u"), mx.float16: ("__half2", "0x64006400u")}

_OUT = "y[(size_t)row * N + col]"
_PLAIN = _OUT + " = static_cast<T>(v[0]);"
_BIAS = _OUT + " = static_cast<T>(v[0] + static_cast<float>(bias[col]));"
# As stock: the product rounded to T, then the residual added and rounded.
_RESIDUAL = (
    _OUT + " = static_cast<T>(static_cast<float>(static_cast<T>(v[0])) + "
    "static_cast<float>(res[(size_t)row * N + col]));"
)
# SwiGLU as stock computes it from the two rounded products: silu(gate) * up.
_SWIGLU = """const float gt = static_cast<float>(static_cast<T>(v[0]));
        const float ut = static_cast<float>(static_cast<T>(v[1]));
        y[(size_t)row * N + col] = static_cast<T>(gt / (1.0f + expf(-gt)) * ut);"""

# RMSNorm of x folded in: the mma reads x * norm_weight (rounded to T), and
# the sum is scaled by the row's 1 / rms, which every lane's squares make up.
_NORM_LOAD = """uint4 nv[2];
    {
      const uint4* q = reinterpret_cast<const uint4*>(nw + kk);
      nv[0] = q[0];
      nv[1] = q[1];
    }
    const T* nt = reinterpret_cast<const T*>(nv);"""
_NORM_APPLY = """{
        T* ta = reinterpret_cast<T*>(xa);
        T* tb = reinterpret_cast<T*>(xb);
        #pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float fa = static_cast<float>(ta[i]), fb = static_cast<float>(tb[i]);
          const float fn = static_cast<float>(nt[i]);
          ss[m][0] += fa * fa;
          ss[m][1] += fb * fb;
          ta[i] = static_cast<T>(fa * fn);
          tb[i] = static_cast<T>(fb * fn);
        }
      }"""
_NORM_REDUCE = """__shared__ float ssum[WARPS][MT * 16];
  #pragma unroll
  for (int m = 0; m < MT; ++m) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      float q = ss[m][h];
      q += __shfl_xor_sync(0xffffffff, q, 1);
      q += __shfl_xor_sync(0xffffffff, q, 2);
      if (t == 0) ssum[warp][m * 16 + h * 8 + g] = q;
    }
  }"""
_NORM_SCALE = """{
          float q = 0.0f;
          for (int i = 0; i < WARPS; ++i) q += ssum[i][row];
          const float scale = rsqrtf(q / K + EPS);
          #pragma unroll
          for (int p = 0; p < P; ++p) v[p] *= scale;
        }"""

_kernels = {}


def _point(p: int, i: int, packed: bool) -> str:
    """C++ pointing panel p at weight i."""
    if packed:
        return f"wq[{p}] = w{i}; ws[{p}] = s{i}; wz[{p}] = z{i};"
    return f"wp[{p}] = w{i};"


def _select(groups: int, swiglu: bool, packed: bool) -> str:
    """C++ that points the block at its weight panel(s) and output."""
    if swiglu:
        return f"{_point(0, 0, packed)} {_point(1, 1, packed)} y = y0; N = w0_shape[0];"
    lines, base = [], ""
    for i in range(groups):
        point = _point(0, i, packed)
        body = f"{{ {f'blk -= {base}; ' if base else ''}{point} y = y{i}; N = w{i}_shape[0]; }}"
        if i + 1 < groups:
            bound = f"{base} + NB{i}" if base else f"NB{i}"
            lines.append(f"{'else ' if i else ''}if (blk < {bound}) {body}")
            base = bound
        else:
            lines.append(f"else {body}" if i else body)
    return "\n  ".join(lines)


def _kernel(
    dtype, groups: int, bias: bool, swiglu: bool, eps, residual: bool, packed
):
    """The kernel for one combination; `eps` (None: no RMSNorm) is compiled in;
    `packed`: None (dense weights) or the quantized weights' bits (their
    group size is a template argument)."""
    key = (dtype, groups, bias, swiglu, eps, residual, packed)
    if key not in _kernels:
        ptx = PTX_TYPE[dtype]
        norm = eps is not None
        kind = "swiglu" if swiglu else f"g{groups}"
        kind += "_bias" * bias + "_res" * residual + (f"_norm{eps:g}" if norm else "")
        kind += f"_q{packed}" if packed else ""
        load = _DENSE_LOAD
        if packed:
            load = _PACKED4_LOAD if packed == 4 else _PACKED_LOAD
        epilogue = (
            _SWIGLU if swiglu else _BIAS if bias else _RESIDUAL if residual else _PLAIN
        )
        source = _SOURCE
        for name, code in [
            ("WEIGHT_PTRS", _PACKED_PTRS if packed else _DENSE_PTRS),
            ("WEIGHT_LOAD", load),
            ("PAIR", _PAIR[dtype][0]),
            ("MAGIC", _PAIR[dtype][1]),
            ("SELECT", _select(groups, swiglu, packed)),
            ("NORM_LOAD", _NORM_LOAD if norm else ""),
            ("NORM_APPLY", _NORM_APPLY if norm else ""),
            ("NORM_REDUCE", _NORM_REDUCE if norm else ""),
            ("NORM_SCALE", _NORM_SCALE if norm else ""),
            ("EPILOGUE", epilogue),
            ("EPS", f"{float(eps)!r}f" if norm else ""),
        ]:
            source = source.replace(name, code)
        inputs = ["x"]
        for i in range(groups):
            inputs += [f"w{i}", f"s{i}", f"z{i}"] if packed else [f"w{i}"]
        inputs += ["bias"] * bias + ["res"] * residual + ["nw"] * norm
        _kernels[key] = mx.fast.cuda_kernel(
            name=f"dflash_block_linear_{ptx}_{kind}".replace(".", "p").replace(
                "-", "m"
            ),
            input_names=inputs,
            output_names=["y0"] if swiglu else [f"y{i}" for i in range(groups)],
            source=source,
            header=header(dtype),
        )
    return _kernels[key]


def tiling(rows: int, k: int, bits: Optional[int] = None, ns=()):
    """(output columns, warps) per thread block for `rows` rows, input width
    `k`, outputs `ns` and weights of `bits` bits (None: dense): for one tile
    of rows 16 columns and 16 warps splitting K, which put the most loads in
    flight per multiprocessor in the H200 sweep (speed.md section 12); for two
    row tiles 32 columns and 4 warps, for more 32 and 8, which reuse each
    block's rows over twice the columns (H200, Qwen3-8B shapes, 32 rows: a
    layer's launches 226 -> 192 us; 64 rows: q/k/v 77 -> 51, o 41 -> 29 us;
    bench/results/h200-probe-linear-rows-bits.jsonl).
    Packed weights (their dequantization) take 16 columns and 8 warps: they
    need more registers than each of 512 threads may hold ("too many
    resources requested for launch"). 4-bit ones at one row tile by the
    launch's width (`_packed4_one_tile`)."""
    if bits:
        return _packed4_one_tile(ns) if bits == 4 and rows <= 16 else (COLS, WARPS)
    if rows <= 16:
        return COLS, 16 if k % (16 * K_CHUNK) == 0 else WARPS
    if any(n % (2 * COLS) for n in ns):
        return COLS, WARPS
    return 2 * COLS, 4 if rows <= WIDE_ROWS else WARPS


# 4-bit launches of one row tile, by GPU time per launch (Nsight Compute, one
# H100, Qwen3-8B shapes, 16 rows, us at 16 x 4 / 16 x 8 / 64 x 4: q/k/v 18.7 /
# 17.2 / 48.6, o 18.5 / 12.5 / 21.9, down 50.5 / 29.5 / 56.2, gate/up 44.4 /
# 64.6 / 54.3, lm_head 245.7 / 264.5 / 206.8;
# bench/results/h100-ncu-linear4-tilings-s39.csv): narrow launches (a few
# hundred blocks of 16 columns) are latency-bound at 12% active warps with 4
# warps a block and take 8; gate/up's 768 blocks (two panels each) keep 4;
# the head's ~9,500 take 64 columns, each x fragment feeding 4 times the
# weights. A layer's launches 132 -> 104 us, the head 246 -> 207 us.
PACKED4_WIDE = 16384  # output columns from which 4 warps a block keep it busy
PACKED4_HEAD = 65536  # ... and from which 64-column blocks pay


def _packed4_one_tile(ns):
    """(columns, warps) for a 4-bit launch of <= 16 rows with outputs `ns`."""
    width = sum(ns)
    if width >= PACKED4_HEAD and not any(n % (4 * COLS) for n in ns):
        return 4 * COLS, 4
    return (COLS, 4) if width >= PACKED4_WIDE else (COLS, WARPS)


def _kind(w: Weight):
    """What a launch compiles in for weight `w`: None (dense), or its packing."""
    return (w.bits, w.group_size) if isinstance(w, Packed) else None


def tiled(dtype, *weights: Weight) -> bool:
    """Whether the kernel tiles products with these weights for `dtype` inputs
    (in one launch: all dense, or all packed alike)."""
    kinds = {_kind(w) for w in weights}
    return (
        dtype in PTX_TYPE
        and len(kinds) <= 1
        and all(k is None or (k[0] in BITS and k[1] in GROUPS) for k in kinds)
        and all(
            w.ndim == 2
            and w.dtype == dtype
            and w.shape[1] % (WARPS * K_CHUNK) == 0
            and w.shape[0] % 16 == 0
            for w in weights
        )
    )


# Packed weights of group size 128 failed to launch at 64 rows on the H200
# (cuGraphAddKernelNode: invalid argument, every bits/shape tried; 2 and 17 rows
# pass: bench/results/h200-cuda-tests-linear.log; cause not found yet). Above
# two row tiles they take stock's quantized_matmul.
PACKED_MAX_ROWS = {128: 32}


# Above two row tiles the kernel's mma work per weight load holds it to
# ~1.0-1.3 TB/s on the H200, where cuBLAS streams large weights at 2.6-3.2
# TB/s (64 rows, Qwen3-8B shapes: gate/up 157 vs 70 us, down 94 vs 39,
# lm_head 956 vs 386) but small ones slower than the kernel with its norm or
# residual folded (q/k/v 51 vs 84 us, o 29 vs 34):
# bench/results/h200-probe-linear-rows-bits.jsonl. Dense launches of more
# weight elements than this take stock's matmul above WIDE_ROWS rows.
WIDE_ROWS = 32
STOCK_ELEMENTS = 1 << 25


def rows_fit(rows: int, *weights: Weight) -> bool:
    """Whether a launch takes `rows` rows with these weights."""
    packed = [w for w in weights if isinstance(w, Packed)]
    limit = min([MAX_ROWS] + [PACKED_MAX_ROWS.get(w.group_size, MAX_ROWS) for w in packed])
    if not 1 < rows <= limit:
        return False
    wide = rows > WIDE_ROWS and not packed
    return not (wide and sum(math.prod(w.shape) for w in weights) > STOCK_ELEMENTS)


def applies(x: mx.array, *weights: Weight) -> bool:
    """Whether the kernel takes `x @ w.T` for each of `weights` (else stock)."""
    if x.ndim < 2 or mx.default_device() != mx.gpu:
        return False
    k = x.shape[-1]
    return (
        rows_fit(x.size // max(k, 1), *weights)
        and tiled(x.dtype, *weights)
        and all(w.shape[1] == k for w in weights)
    )


def block_of(x: mx.array, w: Weight) -> mx.array:
    """A lazy block (never evaluated) of `x`'s rows and `w`'s input width: what
    `applies` checks for a product whose input is computed later in a layer."""
    return mx.zeros((*x.shape[:-1], w.shape[1]), x.dtype)


class Fits:
    """One wrapper's `applies` answers, kept per input (rows, width, dtype,
    device): what they check of its weights (kind, dtype, shape) does not
    change between calls, since the wrappers are built on the instances they
    mirror, and a 9B verify's ~150 checks cost its host ~2 ms
    (bench/results/h200-probe-verify-profile-qwen3_5-9b.txt). Inputs outside
    2-64 rows are answered no without being kept, so what is kept stays small."""

    __slots__ = ("_kept",)

    def __init__(self):
        self._kept = {}

    def __call__(self, x: mx.array, check) -> bool:
        """Whether the wrapper's launch takes block `x`; `check()` answers
        the first time this kind of input comes."""
        k = x.shape[-1]
        rows = x.size // k if k else 0
        if not 1 < rows <= MAX_ROWS:
            return False
        # The device's type: `mx.Device` objects hash by identity, and each
        # `default_device()` call makes a new one (the memo never hit and grew
        # by every launch of every verify).
        key = (rows, k, x.dtype, mx.default_device().type)
        fit = self._kept.get(key)
        if fit is None:
            fit = self._kept[key] = bool(check())
        return fit


class _Plan(NamedTuple):
    """What a launch passes besides its arrays, for one kind of call."""

    kernel: Any
    template: list
    grid: tuple
    threadgroup: tuple
    output_shapes: list
    output_dtypes: list


# Kept per kind of call (a verify makes ~150 launches of a few kinds): rows
# are at most 64 and the weights' shapes a model's few.
@functools.lru_cache(maxsize=None)
def _plan(shape, dtype, ns, kind, bias, swiglu, eps, residual, cols, warps) -> _Plan:
    """The launch of `_launch` for inputs of `shape`/`dtype` and weights of
    `ns` output rows and packing `kind` ((bits, group size) or None)."""
    # Leading dims are the kernel's rows: no reshape nodes in or out.
    k, lead = shape[-1], shape[:-1]
    m = math.prod(lead)
    auto_cols, auto_warps = tiling(m, k, kind[0] if kind else None, ns)
    cols, warps = cols or auto_cols, warps or auto_warps
    blocks = [n // cols for n in ns]
    template = [
        ("T", dtype),
        ("MT", (m + 15) // 16),
        ("NT", cols // 8),
        ("WARPS", warps),
        ("P", 2 if swiglu else 1),
    ] + [(f"NB{i}", b) for i, b in enumerate(blocks[:-1])]
    if kind is not None:
        template += [("QB", kind[0]), ("GS", kind[1])]
    kernel = _kernel(
        dtype, len(ns), bias, swiglu, eps, residual, kind[0] if kind else None
    )
    outs = ns[:1] if swiglu else ns
    return _Plan(
        kernel,
        template,
        ((blocks[0] if swiglu else sum(blocks)) * 32 * warps, 1, 1),
        (32 * warps, 1, 1),
        [(*lead, n) for n in outs],
        [dtype] * len(outs),
    )


def _launch(
    x,
    weights,
    bias=None,
    swiglu=False,
    norm=None,
    residual=None,
    cols=None,
    warps=None,
):
    """One kernel launch; `norm` = (weight, eps) of an RMSNorm applied to x first,
    `residual` an array added to the (single) output."""
    if bias is not None and residual is not None:
        raise ValueError("block_matmul takes a bias or a residual, not both")
    first = weights[0]
    packed = isinstance(first, Packed)
    p = _plan(
        x.shape,
        x.dtype,
        tuple(w.weight.shape[0] if packed else w.shape[0] for w in weights),
        (first.bits, first.group_size) if packed else None,
        bias is not None,
        swiglu,
        None if norm is None else float(norm[1]),
        residual is not None,
        cols,
        warps,
    )
    inputs = [x]
    for w in weights:
        inputs += [w.weight, w.scales, w.biases] if packed else [w]
    if bias is not None:
        inputs.append(bias)
    if residual is not None:
        if residual.shape != p.output_shapes[0]:
            raise ValueError(f"residual {residual.shape} for output {p.output_shapes[0]}")
        inputs.append(residual)
    if norm is not None:
        inputs.append(norm[0])
    return p.kernel(
        inputs=inputs,
        template=p.template,
        grid=p.grid,
        threadgroup=p.threadgroup,
        output_shapes=p.output_shapes,
        output_dtypes=p.output_dtypes,
    )


def block_matmul(
    x: mx.array,
    weight: Weight,
    bias: Optional[mx.array] = None,
    *,
    residual: Optional[mx.array] = None,
    cols: Optional[int] = None,
    warps: Optional[int] = None,
) -> mx.array:
    """`x @ weight.T (+ bias)` for 2-64 rows of x in one kernel (see `applies`);
    with `residual`, `residual + x @ weight.T` (no bias then).

    `cols` (8, 16, 32) and `warps` (K split per block) override the tiling,
    for probes.
    """
    return _launch(x, [weight], bias, residual=residual, cols=cols, warps=warps)[0]


def block_matmuls(
    x: mx.array, weights: Sequence[Weight], norm=None
) -> List[mx.array]:
    """`[x @ w.T for w in weights]` (up to 3, e.g. q, k, v) in one launch; with
    `norm` = (weight, eps), of `rms_norm(x, weight, eps)` instead of x."""
    return _launch(x, list(weights), norm=norm)


def block_swiglu(x: mx.array, gate: Weight, up: Weight, norm=None) -> mx.array:
    """`silu(x @ gate.T) * (x @ up.T)` in one launch (an MLP's first half);
    `norm` as in `block_matmuls`."""
    return _launch(x, [gate, up], swiglu=True, norm=norm)[0]
