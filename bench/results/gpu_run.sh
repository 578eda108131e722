#!/usr/bin/env bash
# Exactly what produced bench/results/h200-*.{json,md,png} (2026-11-29, one H200, MLX CUDA 0.32.4,
# mlx-lm 0.32.2). On the device machine, from the repo root, after staging MLX CUDA with
# shared/device/mlx-cuda/stage.sh (both halves):   export PYTHONPATH=/root/site:$PWD
# NOTE: these runs profiled the cycle after the warm-up runs (so "verify@new-len" there is a
# warm number); the runner now profiles first. Their "cold x" column is the honest first-run figure.
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --cooldown 0.5 --suites code --prompts-per-suite 1"
# call 1 (part1.log)
$b --shape qwen3-8b --tau 4,6.5,9 --max-tokens 256 --repeats 5 --out $out/h200-qwen3-8b
# (in call 1 the same command for qwen3.5-9b at 256 tokens x 5 repeats ran past its 290 s timeout)
# call 2 (part2.log)
$b --shape qwen3.5-9b --tau 4,6.5,9 --max-tokens 128 --repeats 3 --out $out/h200-qwen3_5-9b
$b --shape smollm2-135m --draft-layers 1 --tau 4,6.5,9 --max-tokens 256 --repeats 5 --out $out/h200-smollm2-135m-shape
