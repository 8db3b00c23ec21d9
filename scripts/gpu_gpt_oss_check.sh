#!/usr/bin/env bash
# gpt-oss on the GPU machine in one device call (docs/models.md, docs/benchmarks.md): its GPU
# tests, then random:gpt-oss-20b in MXFP4 (as published) per `RUNS` (backend:gpu-memory,
# default "resident:24GiB offload:8GiB"; `MODEL=random:gpt-oss-120b` for the big one), then
# `EXTRA` — `scripts/gpu_model_check.sh` with gpt-oss's defaults.
#   run(command="scripts/gpu_gpt_oss_check.sh", carry=[".whl"])
TEST_FILE=tests/gpu/test_gpt_oss_gpu.py MODEL="${MODEL:-random:gpt-oss-20b}" EXPERT_DTYPE=mxfp4 \
  RUNS="${RUNS:-resident:24GiB offload:8GiB}" exec "$(dirname "$0")/gpu_model_check.sh"
