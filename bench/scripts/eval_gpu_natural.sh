#!/usr/bin/env bash
# Issue 23's eval of a fine-tuned drafter beside the shipped one, on ONE H200 in one call (~5 min),
# after `train_gpu_natural.sh GGUF once` on the same warm machine (its run directory in /tmp):
#
#   export PYTHONPATH=/root/site:$PWD
#   SHIPPED=/tmp/default_draft bash bench/scripts/eval_gpu_natural.sh /tmp/SmolLM2-135M-Instruct.Q4_1.gguf
#
# 1. The new drafter's draft vocabulary: every token of its training responses
#    (`python -m mlx_dflash.train.vocab DIR --data data.npz`), or the file VOCAB names.
# 2. One process a suite, side by side (tau does not depend on timing; the GPU has room):
#    new drafter as `generate` runs it (its draft vocabulary): natural by category (+ T 1.0),
#    agent transcripts at 1k / 4k / 7.9k (+ T 1.0), the old list; new drafter over the whole
#    vocabulary: natural, long; the shipped drafter (SHIPPED) over the whole vocabulary: long,
#    old (its natural figure over the whole vocabulary is train_natural.md's), and with its own
#    draft_vocab.json: natural. WHOLE=0 leaves out the whole-vocabulary runs (the shipped
#    drafter's long and old then run with its own draft vocabulary too).
#    Greedy runs are checked token for token against mlx_lm's own greedy decoding. The drafters
#    run alone (--prompt-lookup off), as the figures in train_natural.md were made.
# CPU dry run (real GGUF, tiny scale): RUN=/tmp/dry OUT=/tmp/dry/out PYTHON=.venv/bin/python \
#   EVAL_ARGS="--eval-max-tokens 4 --eval-natural 1 --eval-contexts 1024 --eval-context-prompts 1
#   --eval-sampled-natural 1 --eval-sampled-context 1 --eval-prompts 1" bash bench/scripts/eval_gpu_natural.sh GGUF
# $OUT gets eval.tar (eval-NAME.json and .log for each) and the new draft_vocab.json.
# Two arms trained on the same data (e.g. GROW=5 in a second RUN whose gen/data.npz links the
# first's) in one call, side by side: `RUN=A OUT=$OUT/a bash ... & RUN=B SHIPPED=none OUT=$OUT/b
# bash ... & wait`. Thirteen processes side by side did not finish the natural suites within a
# 400 s CALL_SECONDS (twenty-fifth session): give the arms' natural runs a call of their own.
set -uo pipefail
gguf=${1:?usage: eval_gpu_natural.sh GGUF}
run=${RUN:-/tmp/dflash-natural}
out=${OUT:-$run/out}
shipped=${SHIPPED:-mlx_dflash/default_draft}
PYTHON=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -n "${VOCAB:-}" ]; then  # the training data is gone (a machine gone cold): a given vocabulary
  cp "$VOCAB" "$run/draft/draft_vocab.json"
else
  $PYTHON -m mlx_dflash.train.vocab "$run/draft" --model "$gguf" --data "$run/gen/data.npz" || exit 1
fi
cp "$run/draft/draft_vocab.json" "$out/"
read -ra ev <<< "${EVAL_ARGS:---eval-max-tokens 128 --eval-context-prompts 3 --eval-sampled-natural 3 --eval-sampled-context 1 --eval-prompts 24} --eval-time-budget ${EVAL_SECONDS:-240}"
one() {  # name, drafter dir, --draft-vocab, suites, temperatures
  timeout "${CALL_SECONDS:-480}" $PYTHON -m mlx_dflash.cli train --eval-only --model "$gguf" --out "$2" \
    --draft-vocab "$3" --prompt-lookup off --eval-sets "$4" --eval-temperatures "$5" "${ev[@]}" \
    --eval-json "$out/eval-$1.json" > /dev/null 2> "$out/eval-$1.log"
}
one new-natural "$run/draft" auto natural 1.0 &
one new-long "$run/draft" auto long 1.0 &
one new-old "$run/draft" auto old "" &
if [ "${WHOLE:-1}" = 1 ]; then
  one new-all-natural "$run/draft" all natural "" &
  one new-all-long "$run/draft" all long "" &
  sv=all
else  # WHOLE=0: every arm with its own draft vocabulary only, as generate runs it (6 processes)
  sv=auto
fi
if [ "$shipped" != none ]; then  # SHIPPED=none: a second arm beside a first eval's shipped runs
  one "shipped-$sv-long" "$shipped" $sv long "" &
  one "shipped-$sv-old" "$shipped" $sv old "" &
  one shipped-natural "$shipped" auto natural "" &
fi
wait
tail -n 3 "$out"/eval-*.log
(cd "$out" && tar cf eval.tar --remove-files eval-*)
ls -l "$out"
