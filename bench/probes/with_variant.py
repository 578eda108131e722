"""Probe: run any mlx_dflash command with a probe_linear_variants.py 4-bit
variant (and tiling) in place of matmul.py's 4-bit kernel, so a variant that
wins a launch's GPU time is measured end to end (a verify, a draft pass, the
bench's tok/s and token match against stock) before it is written into
matmul.py. Dense and 8-bit launches keep the shipped text and tiling.

    python bench/probes/with_variant.py --variant late4 --tiling 32x4 -- \
        -m mlx_dflash.bench --shape qwen3-8b --quantize 4 ...
    python bench/probes/with_variant.py --variant late4 -- bench/probes/probe_draft_pass.py qwen3-8b
    python bench/probes/with_variant.py --draft-flush 0 -- -m mlx_dflash.bench ...  # flush off

The bench's results then give this wrapper's command as theirs.

`--tiling` applies to 4-bit launches of one row tile (<= 16 rows), where the
variants' text was written for (probe_linear_variants.FOUR_BIT_ONE_TILE);
larger 4-bit blocks keep the shipped tiling with the variant's text.
"""

import argparse
import runpy
import shlex
import sys

import probe_linear_variants as plv  # bench/probes/, beside this script
from mlx_dflash.kernels import matmul

_BUILD, _TILING = matmul._kernel, matmul.tiling  # the shipped ones


def install(variant: str, tiling: str) -> None:
    """Route matmul.py's 4-bit kernel builds through `variant`'s text and
    its one-tile launches through `tiling` ('auto': matmul.py's)."""
    plv.use_variant(variant)  # tags kernel names, clears matmul's caches
    text = plv.variant_text(variant)

    def kernel(dtype, groups, bias, swiglu, eps, residual, packed):
        # every build goes through here, so each sets the text it compiles
        matmul._SOURCE, matmul._PACKED4_LOAD = text if packed == 4 else plv._SHIPPED
        return _BUILD(dtype, groups, bias, swiglu, eps, residual, packed)

    cols, warps = plv.parse(tiling)

    def tiling_for(rows, k, bits=None, ns=()):
        if bits == 4 and rows <= 16:
            return cols, warps
        return _TILING(rows, k, bits, ns)

    matmul._kernel = kernel
    matmul.tiling = _TILING if cols is None else tiling_for


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=sorted(plv.VARIANTS), help="default: the shipped kernel")
    p.add_argument("--draft-flush", type=int, help="CudaKernels.draft_flush_every instead of its default")
    p.add_argument("--tiling", default="auto", help="COLSxWARPS for 4-bit blocks of <= 16 rows")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- -m MODULE ARGS... | -- SCRIPT ARGS...")
    a = p.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    module = rest[:1] == ["-m"]
    if len(rest) < 1 + module:
        p.error("after --, give -m MODULE or a script, and its arguments")
    if a.variant:
        install(a.variant, a.tiling)
        print(f"with_variant: 4-bit kernel {a.variant}, one-tile tiling {a.tiling}", flush=True)
    if a.draft_flush is not None:
        from mlx_dflash.kernels.cuda import CudaKernels

        CudaKernels.draft_flush_every = a.draft_flush
        print(f"with_variant: draft passes flushed every {a.draft_flush} layers", flush=True)
    if module:
        if rest[1] == "mlx_dflash.bench":  # the results name this wrapper
            from mlx_dflash.bench import cli

            mine = sys.argv[1 : len(sys.argv) - len(a.rest)]
            wrapper = ["python3", "bench/probes/with_variant.py", *mine, "--", "-m"]
            cli.PROGRAM = shlex.join([*wrapper, "mlx_dflash.bench"])
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
