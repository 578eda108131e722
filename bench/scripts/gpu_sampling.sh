#!/usr/bin/env bash
# Issue #22 (sampling speed): what the sampled cycle adds over greedy on the H200, its first-use
# cost, and DFlash against stock mlx_lm at T = 0 and 1.0 in the same run. Writes
# $OUT/h200-probe-sampling-{ops,cold,cycle}.jsonl and $OUT/h200-sampling-{qwen3-8b,qwen3_5-9b}.*
# One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2, ONE call of at most 8 minutes (about 5 expected), after staging MLX CUDA
# (shared/device/mlx-cuda/stage.sh, both halves), from the repo root:
#   export PYTHONPATH=/root/site:$PWD && bash bench/scripts/gpu_sampling.sh
# Every step has its own time limit (480 s in all), so a slow one costs only itself. The probes of
# steps 1-2 get an empty MLX_PTX_CACHE_DIR each, so what a path JIT-compiles on first use is paid
# inside it; steps 3-4 share MLX's default cache, empty on a fresh machine but for what they add.
# A dry run on CPU (tiny shapes, the same steps): SHAPES="tiny-qwen3 tiny-qwen3.5" DTYPE=float32 bash ...
# STEPS picks steps by number (default "1 2 3 4"), SHAPES the two shapes, BENCH step 4's shapes.
set -u
steps=" ${STEPS:-1 2 3 4} "
out=${OUT:-bench/results}
read -r s8 s9 <<< "${SHAPES:-qwen3-8b qwen3.5-9b}"
dtype=${DTYPE:-bfloat16}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
pr="python3 bench/probes/probe_sampling.py"
fresh() { MLX_PTX_CACHE_DIR=$(mktemp -d) "$@"; }

on() { [[ $steps == *" $1 "* ]]; }

# 1. The accept step alone on a (16, V) bf16 block, per path and per op, at both vocabularies.
on 1 && for s in $s8 $s9; do
  fresh timeout 20 $pr ops $s
done | tee "$out/h200-probe-sampling-ops.jsonl"

# 2. Each path's first call in a fresh process (CUDA JIT-compiles gathers/scatters on first use).
on 2 && for path in greedy onehot q legacy-onehot; do
  fresh timeout 15 $pr cold $s8 --path $path || echo "{\"mode\": \"cold\", \"path\": \"$path\", \"over_15_s\": true}"
done | tee "$out/h200-probe-sampling-cold.jsonl"

# 3. Qwen3-8B shape: the first generations in a process (greedy, sampled one-hot, sampled from
#    the DFlash drafter's q after warm-up) and one verify + accept cycle, greedy vs sampled.
on 3 && timeout 120 $pr cycle $s8 --context 1024 --max-tokens 128 | tee "$out/h200-probe-sampling-cycle.jsonl"

# 4. The bench: stock mlx_lm (make_sampler at T = 1) and DFlash engine mode in the same run,
#    after serve's warm-up (--warm-up), the sampled case first: the JSON's
#    calibration.cold_decode_tps is then the first request a warmed server answers, sampled.
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype $dtype --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png --suites code --prompts-per-suite 1 --repeats ${REPEATS:-5} --temp 1.0,0 --warm-up"
on 4 && for s in ${BENCH:-$s8 $s9}; do
  timeout 240 $b --shape $s --out "$out/h200-sampling-warm-${s/./_}"
done
