"""The tensor-core product both block kernels share (matmul.py, flash.py).

`MMA_HEADER` defines `mma16816`: one m16n8k16 product-accumulate with fp32
accumulators; `header(dtype)` fills in its input type (bf16 or f16).
"""

import mlx.core as mx

PTX_TYPE = {mx.bfloat16: "bf16", mx.float16: "f16"}

MMA_HEADER = """
__device__ __forceinline__ void mma16816(float* c, const unsigned* a,
                                         unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.MMA_T.MMA_T.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""


def header(dtype) -> str:
    """`MMA_HEADER` for `dtype` inputs (bf16 or fp16)."""
    return MMA_HEADER.replace("MMA_T", PTX_TYPE[dtype])
