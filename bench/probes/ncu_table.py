"""A table of linear.py kernel launches from an `ncu --csv` log of
probe_linear_variants.py (`--reps 0`): variant, tiling, layer part, GPU time,
share of DRAM peak, registers and active warps.

    python bench/probes/ncu_table.py bench/results/h200-ncu-linear-unroll.csv
"""

import csv
import re
import sys

# Kernel name stems (linear._kernel) -> the layer part they run in the probe.
KINDS = {
    "g3_norm1em06_": "qkv",
    "swiglu_norm1em06_": "gate_up",
    "g1_res_": "o/down",
    "g1_": "lm_head",
}


def launches(path):
    """Per launch, in order: kernel name and metric name -> value."""
    rows = list(csv.reader(l for l in open(path) if l.startswith('"')))
    head = {h: i for i, h in enumerate(rows[0])}
    out = {}
    for r in rows[1:]:
        k = out.setdefault(int(r[head["ID"]]), {"name": r[head["Kernel Name"]]})
        k[r[head["Metric Name"]]] = r[head["Metric Value"]]
    return [out[i] for i in sorted(out)]


def label(name: str, seen_res: dict, reference: bool) -> str:
    if "gemv" in name:
        return "MLX gemv, 1 row"
    m = re.match(
        r"custom_kernel_dflash_block_linear_bf16_(\w+)_bfloat16_t_1_(\d+)_(\d+)_", name
    )
    stem, nt, warps = m.groups()
    stem += "_"
    kind = next(k for k in KINDS if stem.startswith(k))
    variant, part = stem[len(kind) : -1], KINDS[kind]
    if reference:  # evaluated together, in an order MLX picks
        variant += " (ref)"
    elif part == "o/down":  # o_proj, then down_proj, in each group
        key = (variant, nt, warps)
        part = "down" if seen_res.get(key, 0) % 2 else "o"
        seen_res[key] = seen_res.get(key, 0) + 1
    return f"{variant:13s} {int(nt) * 8:2d} cols x {warps:2s} warps  {part}"


def main(path):
    seen = {}
    print(f"{'launch':45s} {'us':>7s} {'DRAM %':>7s} {'regs':>5s} {'warps %':>8s}")
    # The probe's first 5 launches are its reference outputs (linear.py's own
    # tiling).
    for i, k in enumerate(launches(path)):
        us = float(k["gpu__time_duration.sum"].replace(",", "")) / 1e3
        print(
            f"{label(k['name'], seen, i < 5):45s} {us:7.1f} "
            f"{k['dram__throughput.avg.pct_of_peak_sustained_elapsed']:>7s} "
            f"{k['launch__registers_per_thread']:>5s} "
            f"{k['sm__warps_active.avg.pct_of_peak_sustained_active']:>8s}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
