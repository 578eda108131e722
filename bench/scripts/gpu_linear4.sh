#!/usr/bin/env bash
# Issue #25: which 4-bit block-linear kernel issues fewest instructions *and* runs fastest at 16
# rows (a draft or verify block), by GPU time per launch from Nsight Compute, one launch each, no
# host queueing and no order effect. Its SASS counts on the CPU are
# bench/results/cpu-nvcc-sass-s38.jsonl; its first run (thirty-ninth session, one H100, before
# matmul.py tiled 4-bit launches by width, so `auto` there meant 16 x 4) is
# bench/results/h100-ncu-linear4-{variants,tilings}-s39.csv. One call on a machine staged with MLX
# CUDA (shared/device/mlx-cuda/stage.sh), from the repo root, ~3 minutes (TIMED=0):
#   export PYTHONPATH=/root/site:$PWD; OUT=$OUT bash bench/scripts/gpu_linear4.sh
# bench/probes/ncu_table.py prints each CSV (variant, tiling, layer part, GPU time, DRAM / L2 / L1
# bytes, instructions, issue activity, registers, active warps).
set -u
out=${OUT:-bench/results}
command -v ncu >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
m=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_bytes.sum,l1tex__t_bytes.sum
m=$m,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
m=$m,launch__registers_per_thread
ncu="ncu --clock-control none --csv -k regex:dflash_block_linear --metrics $m"
probe="python3 bench/probes/probe_linear_variants.py --bits 4 --rows 16 --reps 0"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -o 'H[0-9][0-9]*' | head -1 | tr H h)  # as gpu_quant.sh

# The decodes and fetches at matmul.py's tilings (auto) and at 16 x 8, which the width rule gives
# q/k/v, o and down (where the shift decode ran faster than the byte permute at 16 x 4 in s39).
timeout 180 $ncu $probe --variants base,shift4,wide4p,late4 --tilings auto,16x8 \
  > $out/$gpu-ncu-linear4-variants.csv 2>&1
# Wider column tiles (each x fragment feeding more weight bytes) and more warps splitting K (o
# and down run at 12-17% active warps at 16 x 4: latency-bound, so more warps may pay there).
timeout 180 $ncu $probe --variants base,wide4p,late4 --tilings 16x8,16x16,32x4,32x8,64x4 \
  > $out/$gpu-ncu-linear4-tilings.csv 2>&1
for f in $out/$gpu-ncu-linear4-*.csv; do python3 bench/probes/ncu_table.py $f; done

# Wall time per call over 8 rotating weight sets (host queueing included), 3 rounds in turn, with
# the stock quantized_matmul for scale: the figure a decode actually sees. TIMED=0 skips it.
[ "${TIMED:-1}" = 0 ] && exit 0
timeout 150 python3 bench/probes/probe_linear_variants.py --bits 4 --rows 16 --rounds 3 --stock \
  --variants base,shift4,wide4p,late4 --tilings auto,16x8,32x4 > $out/$gpu-linear4-timed.txt 2>&1
tail -40 $out/$gpu-linear4-timed.txt
