#!/usr/bin/env bash
# Run the GPU test suite on the GPU machine (see docs/gpu.md). The machine has torch,
# transformers 5.17 and no network: the wheels we need travel in .whl/ (carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src:$PWD" EDGEMOE_CACHE_DIR=/tmp/edgemoe-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="--import-mode=importlib" "$@" 2>&1 | tee "${OUT:-/tmp}/gpu-tests.log"
