#!/usr/bin/env bash
# Issue 13's decode scenario on the GPU machine: random:qwen3-30b-a3b (bf16, 48 layers),
# batch 1, --gpu-memory 16GiB --kv-tokens 8192, once per MoE backend (offload, cpu,
# hybrid, auto), then a summary: auto's decode tok/s against the best manual backend,
# the controller's choice and learnt rates (the host cache's split for cpu; hybrid and auto
# run on the device cache with the live CPU quota: its settled level and step times), the
# CPU path's GB/s. See docs/benchmarks.md.
#   LAYERS=12 scripts/gpu_backend_sweep.sh    # a 12-layer slice (quicker; same per-layer figures)
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
out="${OUT:-bench/results}/backend-sweep"
mkdir -p "$out"
model="random:qwen3-30b-a3b${LAYERS:+?num_hidden_layers=$LAYERS}"
for backend in ${BACKENDS:-offload cpu hybrid auto}; do
  python3 -m edgemoe.cli bench decode --model "$model" --dtype bfloat16 --gpu-memory 16GiB --kv-tokens 8192 \
    --moe-backend "$backend" --prompt-tokens 128 --batch-sizes 1 --decode-tokens "${DECODE_TOKENS:-64}" \
    --out "$out/$backend" 2>&1 | grep -v "it/s\]" | tee "$out/$backend.log"
done
python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
runs = {}
for path in glob.glob(f"{out}/*/decode-*.json"):
    d = json.load(open(path))
    runs[d["moe"]["backend"]] = d
summary = {}
for name, d in sorted(runs.items()):
    row, final = d["rows"][0], d["moe"]["final"]
    split = final.get("split", {})
    cpu_gbs = 9437184 / (split["cpu_us_per_expert"] * 1e-6) / 1e9 if split.get("cpu_us_per_expert") else None
    live_cpu = final["cpu_seconds"] and final["experts_cpu"] * 9437184 / final["cpu_seconds"] / 1e9
    summary[name] = {"decode_tok_s": row["decode_tok_s"], "ms_per_step": row["decode_step_ms"],
                     "hit_rate": row["decode_moe"]["hit_rate"], "slots": d["moe"]["slots"],
                     "cpu_kernel": final.get("cpu_kernel"), "cpu_gb_s_learnt": cpu_gbs,
                     "cpu_gb_s_wall_incl_handoff": live_cpu or None,
                     "split": {k: split.get(k) for k in ("choice", "reason", "cpu_share", "copy_us_per_expert",
                                                         "cpu_us_per_expert", "cpu_call_us", "probes")} if split else None,
                     "cpu_quota_unit": final.get("cpu_quota_unit"),
                     "cpu_quota_settled": final.get("cpu_quota_settled"),
                     "cpu_quota_step_ms": final.get("cpu_quota_step_ms"),
                     "lru_replay_hit_rate": row.get("cache_replay", {}).get("lru", {}).get("hit_rate")}
manual = {k: v["decode_tok_s"] for k, v in summary.items() if k != "auto"}
if "auto" in summary and manual:
    best = max(manual, key=manual.get)
    summary["auto_vs_best_manual"] = {"best": best, "ratio": summary["auto"]["decode_tok_s"] / manual[best],
                                      "target": ">= 0.95"}
print(json.dumps(summary, indent=1))
open(f"{out}/summary.json", "w").write(json.dumps(summary, indent=1))
PY
