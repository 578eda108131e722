"""Run `mlx-dflash bench` with block attention left on MLX's fused call.

A control for bench/results/h200-speed-qwen3-8b-16k-folded.*: the same command
with `Target`'s and the draft's `block_attention_from` default set to never
(attention.py), so the two runs differ only in that.

    python bench/probes/run_without_fold.py <mlx-dflash bench arguments>
"""

import runpy
import sys

from mlx_dflash.kernels.cuda import CudaKernels

CudaKernels.fold_from = float("inf")
sys.argv = ["mlx_dflash.bench"] + sys.argv[1:]
runpy.run_module("mlx_dflash.bench", run_name="__main__")
