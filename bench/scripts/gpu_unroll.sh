#!/usr/bin/env bash
# Exactly what produced bench/results/h200-ncu-linear-*.csv, h200-probe-linear-variants.jsonl,
# h200-unroll*-*, h200-probe-verify-9b-unroll.jsonl, h200-probe-cycle-unroll.jsonl and
# h200-ncu-verify-kernels.csv
# (eighth session, 2026-11-30; speed.md section 12). One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2,
# after staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both halves), from the repo root:
#   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
# Six fresh machines (calls 1, 2, 3+4, 5, 6, 7); compare ratios within one bench command.
# Calls 1 and 2 ran linear.py as it was at 39717a4 (unroll 2; 32 columns x 8 warps), and
# bench/probes/probe_linear_variants.py named that kernel "base" and the unroll-4 edit "u4". From
# call 3 on, linear.py is unrolled 4 deep with 16 columns x 16 warps: the probe's "base" is
# that kernel, and "u2" is the old unrolling.
set -u
out=${OUT:-bench/results}
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png"
m=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active
ncu="ncu --clock-control none --csv -k regex:dflash_block_linear|gemv --metrics $m"

# Call 1 (39717a4): the CUDA tests after last session's text-only refactors (189 passed), then
# the probe's own timing (it includes Python's time to queue the calls: too noisy to rank).
python3 -m pytest -q -x tests/test_linear.py tests/test_flash.py
python3 bench/probes/probe_linear_variants.py --variants base,coal,coal_nc,coal_nc256 \
  --tilings 32x8,32x4,16x8,64x4 | tee $out/h200-probe-linear-variants.jsonl

# Call 2 (39717a4): GPU time per launch from Nsight Compute (bench/probes/ncu_table.py prints them).
# The tilings sweep stopped at 8 columns x 32 warps, whose 1,024 threads need more registers
# than a multiprocessor has ("too many resources requested for launch").
$ncu python3 bench/probes/probe_linear_variants.py --reps 0 --variants base \
  --tilings 8x16,8x32,16x4,16x8,16x16,16x24,16x32,32x4,32x8,32x16,32x24,32x32,64x4,64x8 > $out/h200-ncu-linear-tilings.csv 2>&1
$ncu python3 bench/probes/probe_linear_variants.py --reps 0 --variants u1,u4,nc256,coal \
  --tilings 16x16,32x8,32x16 > $out/h200-ncu-linear-variants.csv 2>&1

# Call 3 (the shipped kernel: unroll 4, 16 columns x 16 warps): tests, the shipped kernel
# against the old unrolling, the 8B bench.
python3 -m pytest -q -x tests/test_linear.py                          # 72 passed
python3 -m pytest -q -x tests/test_flash.py -k "draft or verify_logits"  # 3 passed
$ncu python3 bench/probes/probe_linear_variants.py --reps 0 --variants base,u2 --tilings auto,32x8 > $out/h200-ncu-linear-unroll.csv 2>&1
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-unroll-qwen3-8b

# Call 4 (same machine, right after call 3).
$b --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-unroll-qwen3-8b-16k
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-unroll-qwen3_5-9b
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-unroll2-qwen3_5-9b
python3 bench/probes/probe_verify.py qwen3_5_9b --context 1024 --reps 30 | tee $out/h200-probe-verify-9b-unroll.jsonl
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-unroll2-qwen3-8b

# Call 5 (a fresh machine, same code).
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 11 --out $out/h200-unroll3-qwen3-8b
python3 bench/probes/probe_cycle.py qwen3-8b --every 4 --reps 20 | tee $out/h200-probe-cycle-unroll.jsonl

# Call 6 (a fresh machine, same code): a verify's and a step's GPU kernels by kind.
ncu --clock-control none --csv --metrics gpu__time_duration.sum \
  python3 bench/probes/probe_verify_kernels.py qwen3-8b > $out/h200-ncu-verify-kernels.csv 2>&1
python3 bench/probes/probe_verify_kernels.py --table $out/h200-ncu-verify-kernels.csv

# Call 7 (a fresh machine, same code): one more 8B run.
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-unroll4-qwen3-8b
