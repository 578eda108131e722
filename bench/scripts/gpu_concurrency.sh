#!/usr/bin/env bash
# Issue #20 (concurrency): what produced bench/results/h200-concurrency-*. One H200, MLX CUDA
# 0.32.4, mlx-lm 0.32.2, after staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both halves),
# from the repo root:   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
#   bash bench/scripts/gpu_concurrency.sh 8b   Qwen3-8B shape, bf16, engine mode tau 6.5: C = 1, 2, 4
#   bash bench/scripts/gpu_concurrency.sh 9b   Qwen3.5-9B shape (hybrid), the same
#   bash bench/scripts/gpu_concurrency.sh probe  a batched cycle's phases at 1, 2, 4 rows (8B shape)
#   bash bench/scripts/gpu_concurrency.sh solo   one request alone vs as a batch of one, and where
#                                                the batch of one's extra host time goes (8B shape)
# Each C: stock mlx_lm's BatchGenerator, our one-at-a-time loop (serve --max-batch 1) and our
# batched verify (serve --max-batch C) on the same C prompts, every stream checked against
# stock greedy. A dry run on CPU: SHAPE_8B=tiny-qwen3 SHAPE_9B=tiny-qwen3.5 DTYPE=float32 bash ...
set -u
out=${OUT:-bench/results}
reps=${REPEATS:-3}
levels=${LEVELS:-1,2,4}
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype ${DTYPE:-bfloat16} --peaked --cooldown 0.5 --tau 6.5 --max-tokens ${MAX_TOKENS:-256} --no-png --suites code --prompts-per-suite 4 --repeats $reps --concurrency $levels"
for what in "$@"; do
  case $what in
  8b) timeout ${SECONDS_EACH:-270} $b --shape ${SHAPE_8B:-qwen3-8b} --out $out/h200-concurrency-qwen3-8b ;;
  probe) timeout ${SECONDS_EACH:-270} python3 bench/probes/probe_batch_cycle.py ${SHAPE_8B:-qwen3-8b} \
      --rows 1,2,4 --dtype ${DTYPE:-bfloat16} | tee $out/h200-probe-batch-cycle-qwen3-8b.jsonl ;;
  solo) timeout ${SECONDS_EACH:-270} python3 bench/probes/probe_batch_solo.py ${SHAPE_8B:-qwen3-8b} \
      --dtype ${DTYPE:-bfloat16} --profile | tee $out/h200-probe-batch-solo-qwen3-8b.jsonl ;;
  9b) timeout ${SECONDS_EACH:-270} $b --shape ${SHAPE_9B:-qwen3.5-9b} --out $out/h200-concurrency-qwen3_5-9b ;;
  esac
done
