#!/usr/bin/env bash
# The default drafter for prompts like people's (issue 23): fine-tune the shipped drafter
# (mlx_dflash/default_draft) on the 'natural' prompt set, then measure it on every eval suite.
# On ONE H200, two calls of at most 9 minutes, back to back on one warm machine (the run
# directory under /tmp persists between them), from the repo root after staging MLX CUDA
# (shared/device/mlx-cuda/stage.sh) and copying the target GGUF to the machine:
#
#   export PYTHONPATH=/root/site:$PWD
#   call 1: bash bench/scripts/train_gpu_natural.sh /tmp/SmolLM2-135M-Instruct.Q4_1.gguf 1
#   call 2: bash bench/scripts/train_gpu_natural.sh /tmp/SmolLM2-135M-Instruct.Q4_1.gguf 2
#
# call 1 (~525 s): the target answers the prompts (<= GEN_SECONDS: NATURAL natural requests,
#   WIDE of the old 'wide' prompts, LONG agent transcripts of LONG_TOKENS tokens; a SAMPLED
#   share at T 1.0, the rest greedy; <= 256 new tokens; SEED picks the prompts, PIECES the
#   version of the pieces the natural requests are composed from: --natural-pieces; SELF
#   requests the target writes itself at SELF_TEMP, answered with the rest: --self-requests), then
#   fine-tuning from INIT starts and runs until CALL_SECONDS after the call began (checkpoint
#   every 200 steps; SOFT > 0 weighs in the target's own top-SOFT_K distributions, --soft-labels;
#   GROW=N appends layers to INIT's up to N, starting as INIT's function, --grow-layers;
#   EXTRA_DATA names earlier draws' data.npz files, space-separated, to train on as well;
#   VAL_SHARE holds that share of the draw out of training and VAL_NATURAL=1 answers the natural
#   held-out set; every VAL_EVERY steps each gets greedy decoding's tau, walked from one
#   teacher-forced pass: --val-share, --val-natural).
# call 2 (~525 s): fine-tuning resumes until EVAL_SECONDS + PACK_SECONDS before CALL_SECONDS,
#   then `train --eval-only` on the quantized target as shipped: the natural held-out set by
#   category (greedy, checked against plain greedy; sampled at T 0.7 / 1.0), agent transcripts
#   at 1k / 4k / 7.9k tokens (SmolLM2's context is 8192: no 16k), the old list; suites that
#   would start after the eval's budget are listed as skipped. Then $OUT gets
#   model.safetensors in <16 MiB parts (rejoin: cat model.safetensors.part-* >
#   mlx_dflash/default_draft/model.safetensors), config.json, eval.json, run.tar (reports,
#   logs) and the generated data in parts (data.npz.part-*). If call 1 dies mid-training, call 2 resumes from the last checkpoint.
#
# Or ONE call: `... GGUF once` generates, trains until PACK_SECONDS + 25 s before CALL_SECONDS
# and packs, without the eval (TRAIN_SECONDS sizes the schedule: set it to the training left).
# A longer schedule over two calls without the built-in eval: `... GGUF 1`, then `... GGUF more`
# (resumes, trains until the pack's time, packs), with TRAIN_SECONDS the training of both.
#
# The generation batch (GEN_BATCH=1024, GEN_TOKENS=786432) is sized for an H200: on an H100
# (80 GB) it ran out of memory in its third batch (bench/results/train-natural-s31-h100-gen-oom.log);
# GEN_BATCH=512 GEN_TOKENS=393216 ran there at up to 15.9k tok/s (stage 9). On that H100 `more`
# (resume) died after 30 steps, cudaGraphInstantiate out of memory, twice
# (bench/results/train-natural-s32-h100-resume-oom.log): on an H100 prefer `once` or `1` alone;
# where a resumed run dies, `2` and `more` go on with its last checkpoint. Stage 12's training on an
# H100 died the same way at step ~100 from the start, twice, at BATCH_TOKENS=8192; 6144 ran to the
# call's stop (bench/results/train-natural-s35-h100-once.log).
# Generation and training use a float16 dequantized copy of the target; tau is measured on the
# quantized GGUF itself. CPU dry run of both calls (real GGUF, tiny scale):
#   BLAS=auto DTYPE=float32 EVAL_DTYPE=float32 NATURAL=12 WIDE=4 LONG=2 LONG_TOKENS=600,1200 \
#   MAX_NEW=16 GEN_BATCH=8 BATCH=2 ANCHORS=8 STEPS=8 SAVE_EVERY=4 REPORT_EVERY=2 \
#   EVAL_ARGS="--eval-natural 1 --eval-contexts 1024 --eval-context-prompts 1 --eval-sampled-natural 1 --eval-prompts 1 --eval-max-tokens 16" \
#   RUN=/tmp/dry OUT=/tmp/dry/out PYTHON=.venv/bin/python bash bench/scripts/train_gpu_natural.sh GGUF 1|2
set -euo pipefail
gguf=${1:?usage: train_gpu_natural.sh GGUF 1|2|more|once}
call=${2:?usage: train_gpu_natural.sh GGUF 1|2|more|once}
t0=$(date +%s)
run=${RUN:-/tmp/dflash-natural}
out=${OUT:-$run/out}
mkdir -p "$run" "$out"
INIT=${INIT:-mlx_dflash/default_draft}
DTYPE=${DTYPE:-float16}
GEN_SECONDS=${GEN_SECONDS:-250}     # generation cap; a cut drops whole batches at random
TRAIN_SECONDS=${TRAIN_SECONDS:-420} # training in all, both calls: sizes the LR schedule
CALL_SECONDS=${CALL_SECONDS:-525}   # each call ends by then
EVAL_SECONDS=${EVAL_SECONDS:-210}   # call 2: kept for the eval (its suites start within it)
PACK_SECONDS=${PACK_SECONDS:-15}
PYTHON=${PYTHON:-python3}
BLAS=${BLAS:-default}
export PYTHONUNBUFFERED=1
export MLX_ENABLE_TF32=${MLX_ENABLE_TF32:-1}
left() { echo $((CALL_SECONDS - ($(date +%s) - t0) - ${1:-0})); }
# --batch-tokens 12288: at 24576 (three 8k sequences a batch) MLX CUDA 0.32.4 died within 50 steps
# with "an illegal memory access" (bench/results/train-natural-train-crash.log); 12288 ran 2,164.
common=(--model "$gguf" --seed "${SEED:-0}" --dtype "$DTYPE" --max-new-tokens "${MAX_NEW:-256}" --prompt-set natural
  --natural-pieces "${PIECES:-1}")

train() {
  resume=()
  [ -f "$run/draft/train_state/trainer_state.json" ] && resume=(--resume)
  n=$(find "$out" -name "train*.log" | wc -l)
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${common[@]}" \
    --out "$run/draft" --data "$run/gen/data.npz" ${EXTRA_DATA:-} --init "$INIT" ${GROW:+--grow-layers "$GROW"} "${resume[@]}" \
    --batch-size "${BATCH:-16}" --anchors "${ANCHORS:-192}" --batch-tokens "${BATCH_TOKENS:-12288}" \
    --max-len "${MAX_LEN:-8192}" --lr "${LR:-3e-4}" --warmup "${WARMUP:-100}" \
    --steps "${STEPS:-100000}" --time-budget "$TRAIN_SECONDS" --save-every "${SAVE_EVERY:-200}" \
    --report-every "${REPORT_EVERY:-50}" --soft-labels "${SOFT:-0}" --soft-top-k "${SOFT_K:-16}" \
    --val-share "${VAL_SHARE:-0}" ${VAL_NATURAL:+--val-natural} --val-every "${VAL_EVERY:-500}" \
    --eval-prompts 0 --stop-seconds "$1" 2>&1 | tee "$out/train$n.log"
}

generate() {
  # Recorded mix: 14k natural + 4k wide + 1.2k long transcripts, a quarter sampled at T 1.0.
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train "${common[@]}" --out "$run/gen" --gen-only \
    --natural-prompts "${NATURAL:-14000}" --wide-prompts "${WIDE:-4000}" --long-prompts "${LONG:-1200}" \
    --self-requests "${SELF:-0}" --self-temperature "${SELF_TEMP:-0.8}" \
    --long-tokens "${LONG_TOKENS:-1024,7552}" --sampled-share "${SAMPLED:-0.25}" --sample-temperature 1.0 \
    --gen-batch "${GEN_BATCH:-1024}" --gen-batch-tokens "${GEN_TOKENS:-786432}" \
    --gen-time-budget "$GEN_SECONDS" 2>&1 | tee "$out/gen.log"
}

pack() {
  cp "$run/draft/config.json" "$out/"
  cp "$run/draft/report.json" "$out/" 2>/dev/null || true
  cp "$run/gen/report.json" "$out/gen-report.json" 2>/dev/null || true
  (cd "$out" && tar cf run.tar --remove-files ./*.log ./report.json $(ls ./gen-report.json 2>/dev/null) 2>/dev/null || true)
  split -b 15M "$run/draft/model.safetensors" "$out/model.safetensors.part-"
  # The generated data too (its own, not a linked one), so that a machine gone cold loses
  # neither the draft vocabulary's source nor a draw a later stage could train on again
  # (rejoin: cat data.npz.part-* > data.npz; EXTRA_DATA=that path).
  if [ -f "$run/gen/data.npz" ] && [ ! -L "$run/gen/data.npz" ]; then
    split -b 15M "$run/gen/data.npz" "$out/data.npz.part-"
  fi
  ls -l "$out"
}

resume_failed() {
  # The resumed run died (on an H100 it ran out of GPU memory: see the header): the last
  # checkpoint (every SAVE_EVERY steps) is still a drafter, so evaluate and pack that.
  echo "training stopped early; going on with the checkpoint of step $(grep -o '"step": [0-9]*' \
    "$run/draft/train_state/trainer_state.json" | grep -o '[0-9]*')" >&2
}

case $call in
1)
  generate
  train "$(left 25)"
  ;;
once)
  # One call: generate, train until the pack's time, pack; no eval (run it elsewhere).
  generate
  train "$(left $((PACK_SECONDS + 25)))"
  pack
  ;;
more)
  train "$(left $((PACK_SECONDS + 25)))" || resume_failed
  pack
  ;;
2)
  train "$(left $((EVAL_SECONDS + PACK_SECONDS + 25)))" || resume_failed
  budget=$(($(left $((PACK_SECONDS + 25))) - 5))
  # Eval budget: suites start only while it lasts; each runs whole (the biggest, natural greedy, first).
  # shellcheck disable=SC2086
  $PYTHON -m mlx_dflash.cli --blas "$BLAS" train --eval-only --model "$gguf" --out "$run/draft" \
    --prompt-lookup off ${EVAL_DTYPE:+--dtype "$EVAL_DTYPE"} --eval-sets natural,long,old --eval-temperatures 0.7,1.0 \
    --eval-time-budget "$((budget > 30 ? budget - 30 : 1))" --eval-json "$out/eval.json" \
    ${EVAL_ARGS:---eval-context-prompts 3 --eval-sampled-natural 3 --eval-sampled-context 1 --eval-prompts 24 --eval-max-tokens 128} \
    > /dev/null 2> "$out/eval.log" || tail -n 5 "$out/eval.log"
  tail -n 12 "$out/eval.log"
  pack
  ;;
*)
  echo "call must be 1, 2, more or once" >&2
  exit 2
  ;;
esac
echo "call $call: $(($(date +%s) - t0)) s"
