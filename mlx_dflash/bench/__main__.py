# `python -m mlx_dflash.bench` takes `--blas` and loads OpenBLAS as `mlx-dflash bench`
# does: before anything imports mlx (the package __init__s above do not).
import sys

from ..cli import pop_blas, use_blas

_blas, sys.argv[1:] = pop_blas(sys.argv[1:])
use_blas(_blas)

from .cli import main  # noqa: E402

main()
