"""Probe: compile matmul.py's kernel (or a probe_linear_variants.py variant)
with nvcc for sm_90 on any machine that has nvcc, no GPU needed; print the
registers and spills ptxas reports (issue #25: a variant that spills, or needs
more registers than a multiprocessor holds for the tiling's warps, is not
worth a device call).

    python bench/probes/probe_nvcc.py --variants base,wide4p,wide4pu2 [--bits 4] [--rows 16]
        [--cuobjdump PATH]   # also count the K loop's SASS instructions

Cases: a Qwen3-8B layer's gate/up (SwiGLU, the RMSNorm folded in) and o_proj
(the residual added), at the tiling matmul.py picks for the rows and bits
(or `--tiling COLSxWARPS`, as probe_linear_variants.py takes it).
The launch's text is captured where `mx.fast.cuda_kernel` would build it (a
stand-in takes it) and wrapped as MLX wraps it: a template kernel whose
inputs are the named arrays, plus `*_shape` / `*_ndim` where the text reads
them. One JSON line per (variant, case); the .cu files stay in --keep.
"""

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import mlx.core as mx

import probe_linear_variants as plv  # bench/probes/, beside this script
from mlx_dflash.kernels import matmul

CTYPE = {mx.bfloat16: "__nv_bfloat16", mx.uint32: "uint32_t", mx.float32: "float"}


class Captured:
    """Stands in for `mx.fast.cuda_kernel`: keeps the text and the launch."""

    last = None

    def __init__(self, **build):
        self.build = build

    def __call__(self, **launch):
        Captured.last = (self.build, launch)
        return [mx.zeros(s, d) for s, d in zip(launch["output_shapes"], launch["output_dtypes"])]


def weight(n, k, bits):
    w = mx.zeros((n, k), mx.bfloat16)
    if not bits:
        return w
    return matmul.Packed(*mx.quantize(w, group_size=64, bits=bits), 64, bits)


def capture(case, rows, bits, cols=None, warps=None):
    h, f = 4096, 12288
    x = mx.zeros((rows, h), mx.bfloat16)
    if case == "gate_up":
        norm = (mx.ones((h,), mx.bfloat16), 1e-6)
        matmul._launch(
            x, [weight(f, h, bits), weight(f, h, bits)], swiglu=True, norm=norm,
            cols=cols, warps=warps,
        )
    else:
        matmul._launch(
            x, [weight(h, h, bits)], residual=mx.zeros((rows, h), mx.bfloat16),
            cols=cols, warps=warps,
        )
    return Captured.last


def source(build, launch) -> str:
    text = build["source"]
    params = []
    for name, arr in zip(build["input_names"], launch["inputs"]):
        params.append(f"const {CTYPE[arr.dtype]}* {name}")
        params += [f"const int* {name}_shape"] * bool(re.search(rf"\b{name}_shape\b", text))
        params += [f"int {name}_ndim"] * bool(re.search(rf"\b{name}_ndim\b", text))
    params += [f"{CTYPE[d]}* {n}" for n, d in zip(build["output_names"], launch["output_dtypes"])]
    tmpl = launch["template"]
    decl = ", ".join(("typename " if isinstance(v, mx.Dtype) else "int ") + k for k, v in tmpl)
    args = ", ".join(CTYPE[v] if isinstance(v, mx.Dtype) else str(int(v)) for _, v in tmpl)
    sig = ", ".join(params)
    return (
        "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cstdint>\n"
        f"{build.get('header', '')}\ntemplate <{decl}>\n__global__ void kernel({sig}) {{\n"
        f"{text}\n}}\ntemplate __global__ void kernel<{args}>({sig});\n"
    )


def k_loop(cubin: Path, cuobjdump: str) -> dict:
    """The SASS of the kernel's K loop: the backward branch's body with the most
    mma instructions (the unrolled main loop); its instructions, mma among them,
    and its most frequent opcodes."""
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True).stdout
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    pcs = [(int(pc, 16), op, rest) for pc, op, rest in ins]
    best = None
    for pc, op, rest in pcs:
        target = re.match(r"\s*(0x[0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < pc:
            body = [o for q, o, _ in pcs if int(target.group(1), 16) <= q <= pc]
            mma = sum(o.startswith("HMMA") for o in body)
            if best is None or mma > best[1]:
                best = (body, mma)
    if best is None:
        return {}
    body, mma = best
    top = dict(Counter(body).most_common(8))
    return {"loop_instructions": len(body), "loop_mma": mma, "loop_top": top}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="base")
    p.add_argument("--bits", type=int, default=4, help="0: dense bf16 weights")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--keep", default="/tmp/probe_nvcc")
    p.add_argument("--nvcc", default="nvcc")
    p.add_argument("--tiling", default="auto", help="COLSxWARPS, as probe_linear_variants")
    p.add_argument("--cuobjdump", default="", help="count the K loop's SASS with this cuobjdump "
                   "(PyPI nvidia-cuda-cuobjdump has one)")
    a = p.parse_args()
    cols, warps = plv.parse(a.tiling)
    keep = Path(a.keep)
    keep.mkdir(parents=True, exist_ok=True)
    for variant in a.variants.split(","):
        plv._original = Captured  # use_variant's builds all end there
        plv.use_variant(variant)
        for case in ("gate_up", "o"):
            build, launch = capture(case, a.rows, a.bits, cols, warps)
            cu = keep / f"{variant}_{case}_{a.tiling}.cu"
            cu.write_text(source(build, launch))
            out = subprocess.run(
                [a.nvcc, "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v",
                 "-o", str(cu.with_suffix(".cubin")), str(cu)],
                capture_output=True, text=True,
            )
            log = out.stdout + out.stderr
            regs = re.search(r"Used (\d+) registers", log)
            spill = re.search(r"(\d+) bytes spill stores", log)
            print(json.dumps({
                "variant": variant, "case": case, "tiling": a.tiling, "rows": a.rows, "bits": a.bits or 16,
                "template": {k: (str(v) if isinstance(v, mx.Dtype) else v) for k, v in launch["template"]},
                "ok": out.returncode == 0,
                "registers": int(regs.group(1)) if regs else None,
                "spill_bytes": int(spill.group(1)) if spill else None,
                **({} if out.returncode == 0 else {"error": log[-600:]}),
                **(k_loop(cu.with_suffix(".cubin"), a.cuobjdump)
                   if a.cuobjdump and out.returncode == 0 else {}),
            }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
