#!/usr/bin/env bash
# A model family on the GPU machine in one device call (docs/models.md, docs/benchmarks.md):
# its GPU tests (`TEST_FILE`, plus `TESTS`), then `MODEL` with `--expert-dtype $EXPERT_DTYPE`
# per `RUNS` (backend:gpu-memory, e.g. "resident:40GiB offload:16GiB"; synthetic routing,
# batch 1, 1K prompt), then whatever `EXTRA` names (a command line, own limit).
#   run(command="TEST_FILE=tests/gpu/test_mla_gpu.py MODEL=random:glm-4.7-flash EXPERT_DTYPE=fp8 \
#       RUNS='resident:40GiB offload:16GiB' scripts/gpu_model_check.sh", carry=[".whl"])
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${TEST_LIMIT:-200}" python3 -m pytest "${TEST_FILE}" ${TESTS:-} -q -p no:cacheprovider \
  -o addopts="--import-mode=importlib" 2>&1 | tail -n 25
for run in ${RUNS}; do
  timeout "${BENCH_LIMIT:-150}" python3 -m edgemoe.cli bench decode --model "${MODEL}" \
    --expert-dtype "${EXPERT_DTYPE}" --gpu-memory "${run#*:}" --kv-tokens 8192 --moe-backend "${run%%:*}" \
    --routing synthetic --prompt-tokens 1024 --batch-sizes 1 --decode-tokens "${DECODE_TOKENS:-160}" --out "$out" 2>&1 \
    | grep -v "it/s\]\|s/it\]\|layer/s\]" | tail -n 14
done
if [ -n "${EXTRA:-}" ]; then timeout "${EXTRA_LIMIT:-150}" bash -c "$EXTRA" 2>&1 | tail -n 25; fi
save_jit_cache
