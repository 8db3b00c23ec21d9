#!/usr/bin/env bash
# The full-size random Qwen3-30B-A3B (48 layers, bf16) on the GPU machine:
# `bench decode --profile`, resident at 1K/8K/32K prompts and batches 1/8/32, and the
# 16 GiB offload scenario. Results in $OUT (JSON + PNG).
# Through the device tool: run(command="scripts/gpu_hotpath.sh", carry=[".whl"]).
# EXTRA="--no-cuda-graph" runs the same eagerly (per-region breakdown); EXTRA="--no-overlap"
# runs the serial engine loop (overlap scheduling is on by default with a GPU).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-bench/results}"
model="random:qwen3-30b-a3b"
bench() { python3 -m edgemoe.cli bench decode --model "$model" --profile --profile-steps 8 --out "$out" ${EXTRA:-} "$@"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bench --moe-backend resident --prompt-tokens 1024 8192 --batch-sizes 1 8 32 --decode-tokens 32
bench --moe-backend resident --prompt-tokens 32768 --batch-sizes 1 --decode-tokens 32 --max-prefill-tokens 8192
bench --gpu-memory 16GiB --kv-tokens 8192 --prompt-tokens 1024 --batch-sizes 1 --decode-tokens 32
