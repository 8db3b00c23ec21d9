#!/usr/bin/env bash
# GLM-4.5 on the GPU machine in one device call (docs/models.md, docs/benchmarks.md):
# its GPU tests, then random:glm-4.5-air at int4 at `GPU_MEMORY` (24 GiB: its 12.0 GiB of dense weights and workspace leave a 16 GiB card no room for 8K of KV) (offload, synthetic
# routing, batch 1, 1K prompt), then whatever `EXTRA` names (a command line, own limit).
#   run(command="scripts/gpu_glm_check.sh", carry=[".whl"])
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout "${TEST_LIMIT:-200}" python3 -m pytest tests/gpu/test_glm4_gpu.py ${TESTS:-} -q -p no:cacheprovider \
  -o addopts="--import-mode=importlib" 2>&1 | tail -n 15
for backend in ${BACKENDS:-offload}; do
  timeout "${BENCH_LIMIT:-220}" python3 -m edgemoe.cli bench decode --model random:glm-4.5-air --expert-dtype int4 \
    --gpu-memory "${GPU_MEMORY:-24GiB}" --kv-tokens 8192 --moe-backend "$backend" --routing synthetic --prompt-tokens 1024 \
    --batch-sizes 1 --decode-tokens "${DECODE_TOKENS:-160}" --out "$out" 2>&1 \
    | grep -v "it/s\]\|s/it\]" | tail -n 25
done
if [ -n "${EXTRA:-}" ]; then timeout "${EXTRA_LIMIT:-150}" bash -c "$EXTRA" 2>&1 | tail -n 25; fi
save_jit_cache
