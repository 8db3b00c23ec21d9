#!/usr/bin/env bash
# Offload II on the GPU machine: the issue-13 scenario (random:qwen3-30b-a3b, bf16, 48
# layers, batch 1, --gpu-memory 16GiB --kv-tokens 8192) with the expert cache on the host
# (the reference) and on the device (gather and copy-engine movers), under synthetic
# routing (realistic misses; labelled in every output) and the model's own router.
# Through the device tool: run(command="scripts/gpu_offload2.sh", carry=[".whl"]).
# ROUTING="router" or CACHES="device-gather" narrows it; ~1 min per configuration.
# device-cpuN: the device cache with the CPU's share inside the step (--moe-backend hybrid
# --cpu-experts-per-layer N; synthetic routing misses ~2.3 experts per layer and token).
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-bench/results}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for routing in ${ROUTING:-synthetic router}; do
  for cache in ${CACHES:-host device-gather device-copy device-cpu1 device-cpu2}; do
    case "$cache" in
      host) flags="--moe-backend offload --expert-cache host" ;;
      device-gather) flags="--moe-backend offload --expert-cache device --expert-mover gather" ;;
      device-copy) flags="--moe-backend offload --expert-cache device --expert-mover copy" ;;
      device-cpu*) flags="--moe-backend hybrid --expert-cache device --cpu-experts-per-layer ${cache#device-cpu}" ;;
    esac
    echo "== routing=$routing cache=$cache"
    python3 -m edgemoe.cli bench decode --model random:qwen3-30b-a3b --gpu-memory 16GiB --kv-tokens 8192 \
      --routing "$routing" $flags --prompt-tokens 1024 --batch-sizes 1 \
      --decode-tokens 64 --profile --profile-steps 8 --out "$out"
  done
done
save_jit_cache
exit 0
