#!/usr/bin/env bash
# Temporary: fifth device call (host-side trims: dict lookups in layer.py, no class swaps in fused layers).
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png"
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-host-qwen3-8b 2>&1 | tail -5
$b --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-host-qwen3-8b-16k 2>&1 | tail -5
