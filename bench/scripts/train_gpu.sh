#!/usr/bin/env bash
# Stage 1 of the shipped default drafter (mlx_dflash/default_draft; stage 2 is
# train_gpu_wide.sh): from scratch on the 'core' prompt set (13.4k prompts), on one H200 with MLX's
# CUDA backend: two calls of at most 9.5 minutes (CALL_SECONDS), back to back on one warm machine (the run
# directory under /tmp persists between them). From the repo root, after staging MLX CUDA
# (shared/device/mlx-cuda/stage.sh) and copying the target GGUF to the machine:
#
#   export PYTHONPATH=/root/site:$PWD
#   call 1: bash bench/scripts/train_gpu.sh /tmp/SmolLM2-135M-Instruct.Q4_1.gguf 1
#           generate the data set (13.4k prompts, greedy, <= 256 new tokens, ~3 min), then train
#           until 9 minutes after the call began (checkpoint every 200 steps)
#   call 2: bash bench/scripts/train_gpu.sh /tmp/SmolLM2-135M-Instruct.Q4_1.gguf 2
#           resume to the end of the schedule (TRAIN_SECONDS of training in all), then print
#           the held-out tau of the result against the target as shipped (quantized GGUF)
#
# Call 2 leaves in $OUT: model.safetensors split in <16 MiB parts (rejoin:
# cat model.safetensors.part-* > mlx_dflash/default_draft/model.safetensors) and run.tar
# (config.json, report.json, data.npz, tau.json and the logs). EVAL_PROMPTS=0 skips the tau
# check (run it elsewhere: the README's `mlx-dflash train --eval-only` command). If call 1 dies (MLX CUDA once raised "illegal memory
# access" mid-training), run call 2: it resumes from the last checkpoint.
#
# Generation and training use a float16 dequantized copy of the target (dense matmuls; the
# quantized GGUF computes in float16 too); tau is measured on the quantized target itself.
# Scale knobs are the variables below; the CPU dry run of both calls (real GGUF, tiny scale):
#   BLAS=auto DTYPE=float32 EVAL_DTYPE=float32 NUM_PROMPTS=6 MAX_NEW=24 GEN_BATCH=8 BATCH=2 ANCHORS=8 \
#   STEPS=12 SAVE_EVERY=4 REPORT_EVERY=2 EVAL_PROMPTS=1 EVAL_TOKENS=16 CALL_SECONDS=... \
#   RUN=/tmp/dry OUT=/tmp/dry/out PYTHON=.venv/bin/python bash bench/scripts/train_gpu.sh GGUF 1|2
set -euo pipefail
gguf=${1:?usage: train_gpu.sh GGUF 1|2}
call=${2:?usage: train_gpu.sh GGUF 1|2}
t0=$(date +%s)
run=${RUN:-/tmp/dflash-default}
out=${OUT:-$run/out}
mkdir -p "$run" "$out"
DTYPE=${DTYPE:-float16}
GEN_SECONDS=${GEN_SECONDS:-200}       # generation cap; a cut drops whole batches at random
TRAIN_SECONDS=${TRAIN_SECONDS:-770}   # training in all, both calls: sizes the LR schedule
CALL_SECONDS=${CALL_SECONDS:-570}     # stop training this long after a call began
EVAL_SECONDS=${EVAL_SECONDS:-120}     # kept free at the end of call 2 for the tau check
PYTHON=${PYTHON:-python3}
BLAS=${BLAS:-default}                 # auto: OpenBLAS for MLX's CPU matmuls (CPU dry run)
export PYTHONUNBUFFERED=1
export MLX_ENABLE_TF32=${MLX_ENABLE_TF32:-1} # fp32 matmuls of the drafter on tensor cores

common=(--model "$gguf" --out "$run" --seed 0)
train=("${common[@]}" --prompt-set core --dtype "$DTYPE" --max-new-tokens "${MAX_NEW:-256}"
  --gen-batch "${GEN_BATCH:-1024}" --gen-time-budget "$GEN_SECONDS"
  --layers 3 --features 5 --batch-size "${BATCH:-16}" --anchors "${ANCHORS:-192}"
  --lr 5e-4 --warmup "${WARMUP:-200}" --steps "${STEPS:-100000}"
  --time-budget "$TRAIN_SECONDS" --save-every "${SAVE_EVERY:-200}"
  --report-every "${REPORT_EVERY:-50}" --eval-prompts 0)
[ -n "${NUM_PROMPTS:-}" ] && train+=(--num-prompts "$NUM_PROMPTS")
left() { echo $((CALL_SECONDS - ($(date +%s) - t0) - ${1:-0})); }

case $call in
1)
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${train[@]}" --gen-only 2>&1 | tee "$out/gen.log"
  # Startup (target load, data) comes before the training clock starts: keep 30 s spare.
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${train[@]}" --stop-seconds "$(left 30)" 2>&1 |
    tee "$out/train1.log"
  ;;
2)
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${train[@]}" --resume \
    --stop-seconds "$(left $((EVAL_SECONDS + 30)))" 2>&1 | tee "$out/train2.log"
  # The target as shipped: the quantized GGUF (EVAL_DTYPE=float32 for a CPU dry run).
  if [ "${EVAL_PROMPTS:-24}" != 0 ]; then
    $PYTHON -m mlx_dflash.cli --blas "$BLAS" train --eval-only "${common[@]}" ${EVAL_DTYPE:+--dtype "$EVAL_DTYPE"} \
      --eval-prompts "${EVAL_PROMPTS:-24}" --eval-max-tokens "${EVAL_TOKENS:-256}" \
      2>> "$out/train2.log" | tee "$out/tau.json"
  fi
  cp "$run/config.json" "$run/report.json" "$run/data.npz" "$out/"
  (cd "$out" && tar cf run.tar --remove-files config.json report.json data.npz *.log $(ls tau.json 2>/dev/null))
  split -b 15M "$run/model.safetensors" "$out/model.safetensors.part-"
  ls -l "$out"
  ;;
*)
  echo "call must be 1 or 2" >&2
  exit 2
  ;;
esac
