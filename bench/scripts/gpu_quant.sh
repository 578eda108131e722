#!/usr/bin/env bash
# Quantized targets on the H200 (issue #25): what produced bench/results/h200-q4-* and h100-q4-*. One H200,
# MLX CUDA 0.32.4, mlx-lm 0.32.2, after staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both
# halves), from the repo root:   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
#   bash bench/scripts/gpu_quant.sh 8b    Qwen3-8B shape, 4-bit g64 target: bf16 and 4-bit drafts, one run
#   bash bench/scripts/gpu_quant.sh 9b    Qwen3.5-9B shape (hybrid), the same
#   bash bench/scripts/gpu_quant.sh 27b   Qwen3.6-27B shape (hybrid; the seeds' 4-bit target), the same
#   GGUF=/tmp/SmolLM2-135M-Instruct.Q4_1.gguf bash bench/scripts/gpu_quant.sh zlab
#                                         the default pair: ours beside z-lab's reference loop
#                                         (pip install --no-deps dflash==0.1.0 first)
#   bash bench/scripts/gpu_quant.sh cuda  the whole GPU suite (pytest -m cuda), log in $OUT
#   bash bench/scripts/gpu_quant.sh slack how much extra device time a draft pass takes before the
#                                         cycle grows (probe_cycle_slack.py --per-cycle on each of SHAPES,
#                                         default the 27B, 8B and 9B shapes, 4-bit; REPEATS rounds; delays and
#                                         the verify flushes auto, 4@1 and 1 take turns cycle by cycle; EXTRA
#                                         adds probe flags, e.g. EXTRA="--max-tokens 1024 --delays 0,0.5,1,2")
# EXTRA adds bench flags to the 8b / 9b / 27b runs, e.g. EXTRA="--draft-flush 0,1" TAG=-flush (draft
# passes flushed and not, alternating within each case).
# VIA runs the 8b / 9b benches through a 4-bit kernel variant not yet in matmul.py, TAG names it:
#   VIA="python3 bench/probes/with_variant.py --variant late4 --tiling 32x4 --" TAG=-late4-32x4 \
#     bash bench/scripts/gpu_quant.sh 8b
set -u
out=${OUT:-bench/results}
# Files are named by the card that ran them (h100, h200; h200 where nvidia-smi is absent).
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -o 'H[0-9][0-9]*' | head -1 | tr H h)
gpu=${gpu:-h200}
reps=${REPEATS:-3}  # SECONDS_EACH: the 8b / 9b runs' timeout
b="${VIA:-python3} -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png --suites code --prompts-per-suite 1 --repeats $reps --quantize 4 --group-size 64 --draft-quantize none,4 ${EXTRA:-}"
for what in "$@"; do
  case $what in
  8b) timeout ${SECONDS_EACH:-200} $b --shape qwen3-8b --out $out/$gpu-q4-qwen3-8b-drafts${TAG:-} ;;
  9b) timeout ${SECONDS_EACH:-220} $b --shape qwen3.5-9b --out $out/$gpu-q4-qwen3_5-9b-drafts${TAG:-} ;;
  27b) timeout ${SECONDS_EACH:-300} $b --shape qwen3.6-27b --out $out/$gpu-q4-qwen3_6-27b-drafts${TAG:-} ;;
  zlab)
    d=mlx_dflash/default_draft
    timeout 150 python3 -m mlx_dflash.bench --model "${GGUF:?GGUF=path}" --draft $d,zlab:$d \
      --suites code,copy_edit --prompts-per-suite 1 --max-tokens 128 --repeats 3 --cooldown 0.5 \
      --no-png --out $out/$gpu-default-pair-zlab
    ;;
  slack)
    for shape in ${SHAPES:-qwen3.6-27b qwen3-8b qwen3.5-9b}; do
      timeout ${SECONDS_EACH:-200} python3 bench/probes/probe_cycle_slack.py $shape --per-cycle \
        --rounds ${REPEATS:-4} --verify-flush auto,4@1,1 ${EXTRA:-} \
        | tee $out/$gpu-probe-cycle-slack-percycle-${shape/./_}${TAG:-}.jsonl
    done
    ;;
  cuda)
    # With pytest-xdist on the device 8 workers compile the kernels side by side: 156 s instead
    # of > 400. Here: pip download -d .wheels pytest-xdist execnet (ignored by git, so carry
    # ".wheels"); there: pip install --no-index --no-deps --target /root/site .wheels/*.whl
    set -o pipefail
    par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout "${CUDA_SECONDS:-420}" python3 -m pytest $par -q -rfE -m cuda -p no:cacheprovider tests 2>&1 \
      | tee $out/$gpu-cuda-tests.log
    ;;
  esac
done
