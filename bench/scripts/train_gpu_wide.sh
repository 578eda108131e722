#!/usr/bin/env bash
# Stage 2 of the shipped default drafter (mlx_dflash/default_draft): widen the data to the
# 'wide' prompt set (49.8k prompts, which contains stage 1's 13.4k 'core' prompts) and fine-tune
# the stage-1 drafter on it. Stage 1 is train_gpu.sh (from scratch, --prompt-set core).
# On an nvidia-h200-x2 (two H200s: generation runs one shard per GPU; training uses GPU 0),
# in calls of at most 9.5 minutes on one warm machine, after staging MLX CUDA:
#
#   export PYTHONPATH=/root/site:$PWD
#   call gen:    bash bench/scripts/train_gpu_wide.sh GGUF gen
#                answer the wide prompts that stage 1's data (STAGE1_DATA) lacks, <= GEN_SECONDS
#   call train:  bash bench/scripts/train_gpu_wide.sh GGUF train
#                fine-tune INIT (the stage-1 drafter) on both; the first call starts the schedule
#                (TRAIN_SECONDS of training in all), later calls resume it
#   call last:   bash bench/scripts/train_gpu_wide.sh GGUF train && bash ... GGUF pack
#                pack: model parts, run.tar (config, report, data.npz, logs) into $OUT
set -euo pipefail
gguf=${1:?usage: train_gpu_wide.sh GGUF gen|train|pack}
call=${2:?usage: train_gpu_wide.sh GGUF gen|train|pack}
t0=$(date +%s)
run=${RUN:-/tmp/dflash-wide}
out=${OUT:-$run/out}
mkdir -p "$run" "$out"
STAGE1_DATA=${STAGE1_DATA:-.stage/stage1-data.npz}
INIT=${INIT:-mlx_dflash/default_draft}
GEN_SECONDS=${GEN_SECONDS:-240}
TRAIN_SECONDS=${TRAIN_SECONDS:-1200} # sizes the LR schedule
CALL_SECONDS=${CALL_SECONDS:-570}
GPUS=${GPUS:-2}
PYTHON=${PYTHON:-python3}
BLAS=${BLAS:-default}
export PYTHONUNBUFFERED=1
export MLX_ENABLE_TF32=${MLX_ENABLE_TF32:-1}
left() { echo $((CALL_SECONDS - ($(date +%s) - t0) - ${1:-0})); }
common=(--model "$gguf" --seed 0 --dtype "${DTYPE:-float16}" --max-new-tokens "${MAX_NEW:-256}" --prompt-set wide)
[ -n "${NUM_PROMPTS:-}" ] && common+=(--num-prompts "$NUM_PROMPTS")

case $call in
gen)
  for k in $(seq 0 $((GPUS - 1))); do
    CUDA_VISIBLE_DEVICES=$k $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${common[@]}" \
      --out "$run/shard$k" --data "$STAGE1_DATA" --extend --gen-shard "$k/$GPUS" --gen-only \
      --gen-batch "${GEN_BATCH:-1024}" --gen-time-budget "$GEN_SECONDS" \
      > "$out/gen$k.log" 2>&1 &
  done
  wait
  tail -n 3 "$out"/gen*.log
  ;;
train)
  resume=()
  [ -f "$run/draft/train_state/trainer_state.json" ] && resume=(--resume)
  n=$(find "$out" -name "train*.log" | wc -l)
  CUDA_VISIBLE_DEVICES=0 $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${common[@]}" \
    --out "$run/draft" --data "$run"/shard*/data.npz --init "$INIT" "${resume[@]}" \
    --batch-size "${BATCH:-16}" --anchors "${ANCHORS:-192}" --lr "${LR:-3e-4}" \
    --warmup "${WARMUP:-100}" --steps "${STEPS:-100000}" --time-budget "$TRAIN_SECONDS" \
    --save-every "${SAVE_EVERY:-200}" --report-every "${REPORT_EVERY:-50}" --eval-prompts 0 \
    --stop-seconds "$(left 30)" 2>&1 | tee "$out/train$n.log"
  ;;
pack)
  cp "$run/draft/config.json" "$run/draft/report.json" "$run/draft/data.npz" "$out/"
  (cd "$out" && tar cf run.tar --remove-files config.json report.json data.npz *.log)
  split -b 15M "$run/draft/model.safetensors" "$out/model.safetensors.part-"
  ls -l "$out"
  ;;
*)
  echo "call must be gen, train or pack" >&2
  exit 2
  ;;
esac
