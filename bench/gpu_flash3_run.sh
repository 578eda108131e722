#!/usr/bin/env bash
# Temporary: third device call (flash.py uncompiled + the draft's fused layers).
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
python3 -m pytest -q -x tests/test_flash.py -k "noncausal or draft or verify_logits or past or (attention_equals and 32-8-16)" 2>&1 | tail -15 | tee $out/tests3.txt
if ! grep -q " passed" $out/tests3.txt || grep -q "failed\|error" $out/tests3.txt; then exit 1; fi
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --no-png"
$b --attention-kernel on,off --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-fused-qwen3-8b 2>&1 | tail -6
$b --attention-kernel on,off --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-fused-qwen3-8b-16k 2>&1 | tail -6
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-fused-qwen3_5-9b 2>&1 | tail -5
python3 bench/probe_verify.py qwen3_5_9b --context 1024 --reps 30 | tee $out/h200-probe-verify-9b-fused.jsonl
