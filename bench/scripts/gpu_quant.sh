#!/usr/bin/env bash
# Quantized targets on the H200 (issue #25): what produced bench/results/h200-q4-*. One H200,
# MLX CUDA 0.32.4, mlx-lm 0.32.2, after staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both
# halves), from the repo root:   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
#   bash bench/scripts/gpu_quant.sh tests      the quantized kernel's CUDA tests
#   bash bench/scripts/gpu_quant.sh 8b         Qwen3-8B shape, 4-bit g64 target: bf16 draft, 4-bit draft
#   bash bench/scripts/gpu_quant.sh 9b         Qwen3.5-9B shape (hybrid), 4-bit g64 target, bf16 draft
set -u
out=${OUT:-bench/results}
reps=${REPEATS:-5}
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png --suites code --prompts-per-suite 1 --repeats $reps --quantize 4 --group-size 64"
for what in "$@"; do
  case $what in
  tests) python3 -m pytest -q -rf -p no:cacheprovider tests/test_linear.py -k quantized ;;
  8b)
    $b --shape qwen3-8b --out $out/h200-q4-qwen3-8b
    $b --shape qwen3-8b --draft-quantize 4 --out $out/h200-q4-qwen3-8b-q4draft
    ;;
  9b) $b --shape qwen3.5-9b --out $out/h200-q4-qwen3.5-9b ;;
  esac
done
