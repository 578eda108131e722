"""A table of linear.py kernel launches from an `ncu --csv` log of
probe_linear_variants.py (`--reps 0`): variant, tiling, layer part, and the
metrics the log has of GPU time, DRAM, L2 and L1 traffic, instructions, issue
activity, registers and active warps.

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


# Columns: metric, header, value from the CSV's text. A column shows where the
# log has its metric (runs collected different sets).
num = lambda v: float(v.replace(",", ""))
COLUMNS = [
    ("gpu__time_duration.sum", "us", lambda v: f"{num(v) / 1e3:.1f}"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", str),
    ("dram__bytes_read.sum", "DRAM MB", lambda v: f"{num(v) / 1e6:.1f}"),
    ("lts__t_bytes.sum", "L2 MB", lambda v: f"{num(v) / 1e6:.1f}"),
    ("l1tex__t_bytes.sum", "L1 MB", lambda v: f"{num(v) / 1e6:.1f}"),
    ("smsp__inst_executed.sum", "M inst", lambda v: f"{num(v) / 1e6:.2f}"),
    ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue %", str),
    ("launch__registers_per_thread", "regs", str),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "warps %", str),
]


def main(path):
    seen = {}
    rows = [k for k in launches(path) if re.search("dflash_block_linear|gemv", k["name"])]
    cols = [c for c in COLUMNS if rows and c[0] in rows[0]]
    print(f"{'launch':45s} " + " ".join(f"{h:>8s}" for _, h, _ in cols))
    # The probe's first 5 launches are its reference outputs (linear.py's own
    # tiling).
    for i, k in enumerate(rows):
        cells = " ".join(f"{fmt(k[m]):>8s}" for m, _, fmt in cols)
        print(f"{label(k['name'], seen, i < 5):45s} {cells}")


if __name__ == "__main__":
    main(sys.argv[1])
