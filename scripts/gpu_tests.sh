#!/usr/bin/env bash
# Run the GPU test suite on the GPU machine (see docs/gpu.md). The machine has torch,
# transformers 5.17 and no network: the wheels we need travel in .whl/ (carry it).
# The Triton/fla JIT cache travels too: copy the previous call's $OUT/triton-cache.tgz
# into .whl/ to skip recompiling; this run writes it back to $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="--import-mode=importlib" --durations=20 "$@" 2>&1 | tee "${OUT:-/tmp}/gpu-tests.log"
status=${PIPESTATUS[0]}
save_jit_cache
exit "$status"
