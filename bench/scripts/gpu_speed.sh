#!/usr/bin/env bash
# Exactly what produced bench/results/h200-speed-*.{json,md,png} and the probe lines in
# bench/results/speed.md §4. One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2. On the device machine,
# from the repo root, after staging MLX CUDA with shared/device/mlx-cuda/stage.sh (both halves):
#   export PYTHONPATH=/root/site:$PWD
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
# Cycle anatomy (host build vs device, with and without flushing every 4 layers).
for s in qwen3-8b qwen3.5-9b; do
  python3 bench/probes/probe_cycle.py $s --every 4 --reps 30
done
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5"
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --tau 4,6.5,9 --max-tokens 256 --repeats 5 --out $out/h200-speed-qwen3-8b
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --tau 4,6.5,9 --max-tokens 256 --repeats 5 --out $out/h200-speed-qwen3_5-9b
$b --shape qwen3-8b --suites long_16k --tau 6.5 --max-tokens 256 --repeats 3 --out $out/h200-speed-qwen3-8b-16k
