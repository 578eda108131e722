#!/usr/bin/env bash
# Exactly what produced bench/results/h200-flash-*, h200-compiled-*, h200-fused-*, h200-host-*,
# h200-probe-cycle-flash.jsonl, h200-probe-cycle-compiled.jsonl and h200-probe-verify-9b-fused.jsonl
# (seventh session, 2026-11-29/30; speed.md §11). One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2, after
# staging MLX CUDA (shared/device/mlx-cuda/stage.sh, both halves), from the repo root:
#   export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
# Five calls, each on a fresh machine (stock's speed differs between them: compare the arms of
# one bench command, which alternate within each case, not across files). The code each call ran
# is named by commit; call 2 ran an uncommitted variant (described in speed.md §11).
set -u
out=${OUT:-bench/results}
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256"

# Call 1 (commit e4c9651: flash.py, attention only): kernel tests, probe, A/B benches.
python3 -m pytest -q -x tests/test_flash.py
python3 -m pytest -q tests/test_linear.py
for ak in off on; do python3 bench/probes/probe_cycle.py qwen3-8b --every 4 --reps 20 --attention-kernel $ak; done | tee $out/h200-probe-cycle-flash.jsonl
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-flash-qwen3-8b
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-flash-qwen3-8b-16k

# Call 2 (uncommitted: the layer block under mx.compile, array offsets, mx.slice_update): dropped.
python3 -m pytest -q -x tests/test_flash.py
for ak in off on; do python3 bench/probes/probe_cycle.py qwen3-8b --every 4 --reps 20 --attention-kernel $ak; done | tee $out/h200-probe-cycle-compiled.jsonl
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-compiled-qwen3-8b
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-compiled-qwen3-8b-16k

# Call 3 (the commit after it: uncompiled, the draft's fused layers; cache writes still by
# mx.slice_update with an array start).
python3 -m pytest -q -x tests/test_flash.py -k "noncausal or draft or verify_logits or past or (attention_equals and 32-8-16)"
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-fused-qwen3-8b
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-fused-qwen3-8b-16k
$b --no-png --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-fused-qwen3_5-9b
python3 bench/probes/probe_verify.py qwen3_5_9b --context 1024 --reps 30 | tee $out/h200-probe-verify-9b-fused.jsonl

# Call 4 (static-slice cache writes in flash.attend; before the host-side trims).
python3 -m pytest -q -x tests/test_flash.py -k "draft or verify_logits"
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-flash-final-qwen3-8b
$b --no-png --attention-kernel on,off --shape qwen3-8b --suites long_16k --repeats 5 --out $out/h200-flash-final-qwen3-8b-16k

# Call 5 (the final code: + dict lookups in layer.py, no class swaps inside fused layers).
$b --no-png --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-host-qwen3-8b
$b --no-png --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-host-qwen3-8b-16k
