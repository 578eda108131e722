"""The CUDA backend: the launches the block wrappers make, in one object.

Every wrapper of this package (linear.py, layer.py, attention.py, gdn.py)
reaches a kernel only through the backend it was built with, so the kernels
can be swapped at this one seam: a test passes a stand-in that computes each
launch's contract with plain ops (tests/test_linear.py), and `BlockPath` (path.py)
picks `CudaKernels` where MLX CUDA is available. The class attributes are
MLX CUDA's measured defaults for the choices around the kernels.
"""

from . import flash, gdn, matmul, rope


class CudaKernels:
    """The kernels of matmul.py, rope.py, flash.py and gdn.py."""

    name = "cuda"
    # Verify blocks attend with plain ops (attention.py) from this many keys:
    # below it cuDNN was as fast (bench/results/speed.md §7).
    fold_from = 4096
    # `Target.forward(flush=True)` starts every 4th layer's output: building
    # and launching a verify graph costs about as long as running it.
    flush_every = 4
    # A draft pass starts every layer's output as it is built: the build is a
    # third of the pass, and the device waited for all of it (Qwen3-8B draft
    # on one H100, a commit and a pass 3.00 -> 2.36 ms bf16, 3.12 -> 2.72 ms
    # 4-bit; every 2nd layer 2.53 / 2.73: bench/results/README.md, "Fortieth
    # session").
    draft_flush_every = 1
    # `BucketKVCache`: attention compiles per key length on MLX CUDA.
    bucket = True

    # matmul.py: products of blocks of 2-64 rows.
    applies = staticmethod(matmul.applies)
    tiled = staticmethod(matmul.tiled)
    block_matmul = staticmethod(matmul.block_matmul)
    block_matmuls = staticmethod(matmul.block_matmuls)
    block_swiglu = staticmethod(matmul.block_swiglu)

    # rope.py + flash.py: a block's attention over a BucketKVCache.
    attention_applies = staticmethod(flash.applies)
    norm_rope = staticmethod(rope.norm_rope)
    attention = staticmethod(flash.attention)

    def attend(self, p, q, k, v, cache, norms=None, causal=True, advance=True):
        """flash.attend through this backend's `norm_rope` and `attention`."""
        return flash.attend(self, p, q, k, v, cache, norms, causal, advance)

    # gdn.py: the GatedDeltaNet recurrence of a whole block, alone or with
    # everything from the layer's conv input to it.
    delta_applies = staticmethod(gdn.cuda_applies)
    gated_delta = staticmethod(gdn.gated_delta_cuda)
    delta_conv_applies = staticmethod(gdn.conv_applies)
    gated_delta_conv = staticmethod(gdn.gated_delta_conv_cuda)

    def __repr__(self):
        return f"{type(self).__name__}()"
