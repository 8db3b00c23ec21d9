#!/usr/bin/env bash
# Issue 14 on the GPU machine: random:qwen3.5-35b-a3b (bf16) under --gpu-memory 16GiB —
# decode at 1K and 32K context, then a 20-turn coding-agent session's TTFT with the prefix
# cache (GDN state snapshots), without it, and with the host tier. Results in $OUT.
# Through the device tool: run(command="scripts/gpu_hybrids_bench.sh", carry=[".whl"]).
# PART=decode or PART=agent runs one half; AGENT_RUNS="radix host" or "none" splits the agent
# part over two 10-minute calls.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-bench/results}"
model="random:qwen3.5-35b-a3b"
common=(--model "$model" --gpu-memory 16GiB --out "$out")
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${PART:-decode}" != agent ]; then
  python3 -m edgemoe.cli bench decode "${common[@]}" --kv-tokens 40960 --max-prefill-tokens 8192 \
    --prompt-tokens 1024 32768 --batch-sizes 1 --decode-tokens 64 --profile --profile-steps 8
fi
if [ "${PART:-decode}" != decode ]; then
  # AGENT_RUNS narrows the agent part to fit a call: the cache-less run alone takes ~7 min
  # (every turn prefills its whole 11-37K prompt), radix and host ~2.5 min each with loading.
  for run in ${AGENT_RUNS:-radix none host}; do
    case "$run" in
      host) python3 -m edgemoe.cli bench agent "${common[@]}" --turns 20 --cache-types radix --host-cache 8GiB ;;
      *) python3 -m edgemoe.cli bench agent "${common[@]}" --turns 20 --cache-types "$run" ;;
    esac
  done
fi
save_jit_cache
exit 0
