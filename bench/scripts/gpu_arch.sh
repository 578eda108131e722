#!/usr/bin/env bash
# Exactly what produced bench/results/h200-arch-qwen3-8b.* and h200-arch2-qwen3-8b.* (ninth
# session, 2026-12-01): the architecture refactor (kernels/ seam, top-down decode loop, one pair
# loader) against the committed speed. One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2, after staging
# MLX CUDA (shared/device/mlx-cuda/stage.sh, both halves), from the repo root:
#   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
set -u
out=${OUT:-bench/results}
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png"

# Call 1 (kernels/ seam + pair loader + lab layout, before the decode refactor): CUDA tests (this
# command also had tests/test_rollback.py last and a 450 s timeout, which cut it inside
# test_rollback; every test before passed but test_attention's four folded-attention greedy
# tests, test_memory's server test (the device has no HTTP stack or SDKs) and
# test_doctor_report, which failed before the refactor too), then the 8B bench.
python3 -m pytest -q tests/test_linear.py tests/test_flash.py tests/test_gdn.py tests/test_speed.py \
  tests/test_attention.py tests/test_device.py tests/test_memory.py tests/test_doctor.py tests/test_quantize.py
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-arch-qwen3-8b

# Call 2 (fresh machine; + the top-down decode loop): the attention, device and decode files
# (a 200 s timeout cut it inside test_decode; the same six failed, nothing else), then the 8B
# bench again.
python3 -m pytest -q -rf tests/test_attention.py tests/test_device.py tests/test_memory.py \
  tests/test_doctor.py tests/test_quantize.py tests/test_decode.py
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-arch2-qwen3-8b
