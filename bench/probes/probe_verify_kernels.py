"""Probe: the GPU kernels of one verify, and of one plain step, by kind.

Run under Nsight Compute, which times every kernel; marker kernels separate a
16-token verify (`Target.forward` + argmax, as the decode loop builds it) from
a one-token step of the same target at the same context:

    ncu --clock-control none --csv --metrics gpu__time_duration.sum \\
        python bench/probes/probe_verify_kernels.py qwen3-8b > verify.csv
    python bench/probes/probe_verify_kernels.py --table verify.csv

`--quantize 4` profiles the target quantized as `bench --quantize 4` builds it.
"""

import argparse
import re
from collections import defaultdict

import mlx.core as mx


def marker(tag: str):
    """A one-thread kernel whose name tells ncu's log where a section starts."""
    k = mx.fast.cuda_kernel(
        name=f"probe_marker_{tag}",
        input_names=["x"],
        output_names=["y"],
        source="y[0] = x[0];",
    )
    mx.eval(
        k(
            inputs=[mx.zeros((1,))],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.float32],
        )
    )


def run(shape: str, context: int, block: int, quantize=None, group_size: int = 64):
    from mlx_dflash.bench.shapes import build_target
    from mlx_dflash.rollback import rollback, snapshot
    from mlx_dflash.target import Target

    target = Target(build_target(shape, quantize=quantize, group_size=group_size))
    cache = target.make_cache()
    mx.eval(target.forward(mx.random.randint(0, 1000, (1, context)), cache)[0])
    tokens = mx.random.randint(0, 1000, (1, block)).astype(mx.uint32)

    def verify(n):
        saved = snapshot(cache, target.delta_taps)
        logits, _ = target.forward(tokens[:, :n], cache)
        mx.eval(mx.argmax(logits, -1))
        rollback(cache, target.delta_taps, saved, verified=n, kept=0)
        mx.eval([c.state for c in cache])

    for _ in range(2):
        verify(block)
        verify(1)
    marker("verify")
    verify(block)
    marker("step")
    verify(1)
    marker("end")


KINDS = [  # (kind, pattern in the kernel name), first match wins
    ("probe marker", "probe_marker"),
    ("linear.py qkv", "dflash_block_linear_.*_g3"),
    ("linear.py gate/up", "dflash_block_linear_.*_swiglu"),
    ("linear.py o/down", "dflash_block_linear_.*_g1_res"),
    ("linear.py lm_head", "dflash_block_linear_.*_g1_"),
    ("flash.py norm+rope", "dflash_norm_rope"),
    ("flash.py merge", "dflash_flash_merge"),
    ("flash.py attention", "dflash_flash"),
    ("gemv (1 row)", "gemv"),
    ("copy / cache write", "copy|Copy"),
    ("reduce / argmax", "reduce|Reduce|arg"),
]


def table(path: str):
    from ncu_table import launches  # bench/probes/, beside this script

    section, sums, counts = None, defaultdict(float), defaultdict(int)
    for launch in launches(path):
        name = launch["name"]
        m = re.search(r"probe_marker_([a-z]+)", name)
        if m:
            section = m.group(1)
            continue
        if section in (None, "end"):
            continue
        kind = next((k for k, p in KINDS if re.search(p, name)), name[:50])
        us = float(launch["gpu__time_duration.sum"].replace(",", "")) / 1e3
        sums[section, kind] += us
        counts[section, kind] += 1
    for section in ("verify", "step"):
        total = sum(v for (s, _), v in sums.items() if s == section)
        n = sum(v for (s, _), v in counts.items() if s == section)
        print(f"== {section}: {n} kernels, {total / 1e3:.3f} ms of GPU time")
        for (s, kind), v in sorted(sums.items(), key=lambda kv: -kv[1]):
            if s == section:
                print(f"  {kind:50s} {counts[s, kind]:5d} {v:9.1f} us")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shape", nargs="?", default="qwen3-8b")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--quantize", type=int, choices=(4, 8), help="affine bits (as bench)")
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--table", help="print the kernels of an ncu --csv log by kind")
    a = p.parse_args()
    if a.table:
        table(a.table)
    else:
        run(a.shape, a.context, a.block, a.quantize, a.group_size)


if __name__ == "__main__":
    main()
