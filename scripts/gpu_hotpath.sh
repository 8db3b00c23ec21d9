#!/usr/bin/env bash
# Hot path I on the GPU machine: the full-size random Qwen3-30B-A3B (48 layers, bf16),
# `bench decode --profile` resident and in the 16 GiB offload scenario. Results in $OUT.
# Through the device tool: run(command="scripts/gpu_hotpath.sh", carry=[".whl"]).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src" EDGEMOE_CACHE_DIR=/tmp/edgemoe-cache PYTHONUNBUFFERED=1
out="${OUT:-bench/results}"
model="random:qwen3-30b-a3b"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m edgemoe.cli bench decode --model "$model" --moe-backend resident \
  --prompt-tokens ${PROMPTS:-1024} --batch-sizes 1 8 --decode-tokens 32 --profile --profile-steps 8 --out "$out"
python3 -m edgemoe.cli bench decode --model "$model" --gpu-memory 16GiB --kv-tokens 8192 \
  --prompt-tokens ${PROMPTS:-1024} --batch-sizes 1 --decode-tokens 32 --profile --profile-steps 8 --out "$out"
