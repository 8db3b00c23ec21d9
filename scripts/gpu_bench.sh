#!/usr/bin/env bash
# Decode/prefill benchmark on the GPU machine with a mid-size random Qwen3-MoE
# (8 layers x 64 experts of 3 MiB): resident vs offload at a quarter of the experts.
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-bench/results}"
python3 - <<'PY'
from edgemoe.testing import make_checkpoint
make_checkpoint("qwen3_moe", "/tmp/medium", hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
                moe_intermediate_size=512, max_position_embeddings=8192)
PY
for backend in "resident" "offload --moe-slots 128"; do
  python3 -m edgemoe.cli bench decode --model /tmp/medium --moe-backend $backend \
    --prompt-tokens 512 2048 --batch-sizes 1 8 --decode-tokens 64 --out "$out"
done
