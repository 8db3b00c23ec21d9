#!/usr/bin/env bash
# Run the GPU test suite on the GPU machine (see docs/gpu.md). The machine has torch,
# transformers 5.17 and no network: the wheels we need travel in .whl/ (carry it).
# The Triton/fla JIT cache travels too: copy the previous call's $OUT/triton-cache.tgz
# into .whl/ to skip recompiling; this run writes it back to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src:$PWD" EDGEMOE_CACHE_DIR=/tmp/edgemoe-cache PYTHONUNBUFFERED=1
mkdir -p .triton-cache && export TRITON_CACHE_DIR="$PWD/.triton-cache"
# A previous call's JIT cache, carried as .whl/triton-cache.tgz (72 MB unpacked: over the carry limit).
[ -f .whl/triton-cache.tgz ] && tar xzf .whl/triton-cache.tgz -C .triton-cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="--import-mode=importlib" --durations=20 "$@" 2>&1 | tee "${OUT:-/tmp}/gpu-tests.log"
status=${PIPESTATUS[0]}
[ -n "${OUT:-}" ] && tar czf "$OUT/triton-cache.tgz" -C .triton-cache . 2>/dev/null
exit "$status"
