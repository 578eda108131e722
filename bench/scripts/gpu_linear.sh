#!/usr/bin/env bash
# Exactly what produced bench/results/h200-linear-*, h200-layer-*, h200-probe-*linear*.jsonl and
# h200-probe-verify-9b.jsonl (sixth session, 2026-11-29; speed.md §9 and §10). One H200, MLX CUDA 0.32.4, mlx-lm 0.32.2. On the
# device machine, from the repo root, after staging MLX CUDA with shared/device/mlx-cuda/stage.sh
# (both halves):  export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:$PWD
# The calls below were made on four fresh machines (stock's speed differs between them), so
# compare the arms of one bench command, which alternate within each case, not across files.
set -u
out=${OUT:-bench/results}
export PYTHONUNBUFFERED=1

# Kernel exactness on the GPU (CUDA-only tests; tests/conftest.py sets MLX_ENABLE_TF32=0).
python3 -m pytest -q tests/test_linear.py tests/test_attention.py

# Per-call cost of a 16-row product: MLX's gemv (1 row), cuBLASLt (16 rows), linear.py (16 rows),
# and the kernel's tilings; per-node floor of a tiny elementwise op.
python3 bench/probes/probe_linear.py | tee $out/h200-probe-linear.jsonl
python3 bench/probes/probe_linear.py --sweep | tee $out/h200-probe-linear-sweep.jsonl

# Verify anatomy with and without the kernel (context 1k, then 16k and 4k).
for bl in off on; do python3 bench/probes/probe_cycle.py qwen3-8b --every 4 --reps 20 --block-linear $bl; done
for ctx in 16384 4096; do for bl in on off; do
  python3 bench/probes/probe_cycle.py qwen3-8b --context $ctx --every 4 --reps 20 --block-linear $bl
done; done

# Engine-efficiency benches, kernel on and off as two arms of one run.
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --block-linear on,off"
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-linear-qwen3-8b
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-linear-qwen3_5-9b
$b --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-linear-qwen3-8b-16k
$b --shape qwen3-8b --suites long_16k --repeats 5 --out $out/h200-linear-qwen3-8b-16k-r5
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 7 --out $out/h200-linear-qwen3-8b-r7

# Section 10 (layer.py), one later machine: kernel tests, then the A/Bs and the hybrid verify probe.
python3 -m pytest -q tests/test_linear.py -k "norm or grouped or verify_logits or bias"
b="python3 -m mlx_dflash.bench --draft engine --block-size 16 --dtype bfloat16 --peaked --cooldown 0.5 --tau 6.5 --max-tokens 256 --block-linear on,off"
$b --shape qwen3-8b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-layer-qwen3-8b
python3 bench/probes/probe_verify.py qwen3_5_9b --context 1024 --reps 30 | tee $out/h200-probe-verify-9b.jsonl
$b --shape qwen3.5-9b --suites code --prompts-per-suite 1 --repeats 5 --out $out/h200-layer-qwen3_5-9b
$b --shape qwen3-8b --suites long_16k --repeats 3 --out $out/h200-layer-qwen3-8b-16k
