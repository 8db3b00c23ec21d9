#!/usr/bin/env bash
# One device call (~4 min): the MoE decode split-K sweep, the GPU tests of what changed
# since the last suite run (CPU share inside the graph, two-launch attention, the fused
# router by default, split-K), then resident decode at batch 1 with the sweep's best
# split count at T = 1. Results in $OUT/results.tgz.
#   run(command="scripts/gpu_splitk_check.sh", carry=[".whl"], timeout_s=260)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
r=/tmp/splitk-check
mkdir -p "$r"
OUT="$r" timeout 60 python3 scripts/gpu_kernel_bench.py --only moe_splits > "$r/splits.log" 2>&1
grep -E "moe_decode split|^NVIDIA" "$r/splits.log"
best=$(python3 - "$r/gpu_kernel_bench.json" <<'PY' 2>/dev/null || echo 1
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"] if r["kernel"] == "moe_decode split" and r["case"].startswith("T=1 ")]
print(min(rows, key=lambda r: r["us"])["case"].split("S=")[1])
PY
)
echo "best split count at T=1: $best"
timeout 100 python3 -m pytest tests/gpu/test_cpu_share_gpu.py tests/gpu/test_kernels_gpu.py \
  -k "cpu_share or quota or offload or split or decode_attention or route or graph_replays" \
  -q -p no:cacheprovider -o addopts="--import-mode=importlib" -rfE --tb=short 2>&1 | tail -15
EDGEMOE_MOE_GEMV_TILES="16,128,4,16,128,4,$best" timeout 80 python3 -m edgemoe.cli bench decode \
  --model random:qwen3-30b-a3b --moe-backend resident --prompt-tokens 1024 --batch-sizes 1 8 \
  --decode-tokens 32 --out "$r/decode" 2>&1 | grep -E "^prompt|allocator"
tar czf "$OUT/results.tgz" -C "$r" .
