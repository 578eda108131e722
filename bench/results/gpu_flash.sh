#!/usr/bin/env bash
# Exactly what produced bench/results/h200-flash-* and h200-probe-cycle-flash.jsonl (seventh session, 2026-11-29; speed.md §11). One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2, after staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both halves) and export PYTHONPATH=/root/site:$PWD.
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
python3 -m pytest -q -x tests/test_flash.py 2>&1 | tail -15 | tee $out/tests.txt
if ! grep -q " passed" $out/tests.txt || grep -q "failed\|error" $out/tests.txt; then exit 1; fi
python3 -m pytest -q tests/test_linear.py 2>&1 | tail -3 | tee -a $out/tests.txt
for ak in off on; do
  python3 bench/probe_cycle.py qwen3-8b --every 4 --reps 20 --attention-kernel $ak
done | tee $out/h200-probe-cycle-flash.jsonl
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png --attention-kernel on,off"
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-flash-qwen3-8b 2>&1 | tail -25
$b --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-flash-qwen3-8b-16k 2>&1 | tail -25
