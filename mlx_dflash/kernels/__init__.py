"""The block kernels (CUDA) behind one seam: `BlockPath`.

A `Target` holds one `BlockPath`, chosen once (`BlockPath.choose`), and the
`Fitting` it builds for the target's model; the DFlash drafter takes the
target's path for its draft. Nothing outside this package asks which backend
runs.

    path.py       BlockPath (the choice) and Fitting (the wrappers it puts on)
    cuda.py       CudaKernels: the backend, every launch in one object
    mma.py        the tensor-core header matmul.py and flash.py share
    matmul.py     products of blocks of 2-64 rows in one kernel
    linear.py     BlockLinear / BlockMLP wrappers over matmul.py
    rope.py       per-head norms and RoPE of a block's q and k
    flash.py      split-K attention of a block over a BucketKVCache
    attention.py  the plain-ops fold, and the BlockAttention wrapper
    layer.py      whole decoder layers in four launches (target and draft)
    gdn.py        the GatedDeltaNet recurrence of a block
"""

from .path import BlockPath, Fitting

__all__ = ["BlockPath", "Fitting"]
