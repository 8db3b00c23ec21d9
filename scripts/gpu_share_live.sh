#!/usr/bin/env bash
# Issue 13's scenario with the CPU share: the GPU tests of the share, the quota A/B in one
# process (scripts/gpu_cpu_share_ab.py), then offload / hybrid (live quota) / auto, one process
# each ($RUNS: dtype:backend pairs), $DECODE decode tokens (the live quota needs ~10 windows of 8 steps to settle).
# Through the device tool: run(command="scripts/gpu_share_live.sh", carry=[".whl"])
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
res=$OUT/r; mkdir -p "$res"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 240 python3 -m pytest tests/gpu/test_cpu_share_gpu.py -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
    -rfE --tb=short > "$res/tests.log" 2>&1
  rc=$?
  tail -12 "$res/tests.log"
  if [ $rc -ne 0 ]; then echo "== share tests failed (rc $rc): the rest without the bell"; export EDGEMOE_CPU_BELL=0; fi
fi
if [ -z "${SKIP_AB:-}" ]; then
  OUT=$res timeout 200 python3 scripts/gpu_cpu_share_ab.py --picks heat --quotas ${QUOTAS:-0 1 2 3} 2>&1 | grep "^{\|Error"
  for setting in ${ENVS:-}; do  # one process each, e.g. EDGEMOE_CPU_BELL=0 (the host node) EDGEMOE_CPU_SPIN_US=2000
    echo "== $setting"
    env "$setting" OUT=$res/${setting//[^A-Za-z0-9]/_} timeout 150 python3 scripts/gpu_cpu_share_ab.py --picks heat \
      --quotas ${ENV_QUOTAS:-0 2} 2>&1 | grep "^{\|Error"
  done
fi
for run in ${RUNS:-bf16:offload bf16:hybrid bf16:auto}; do  # expert dtype:backend
  dtype=${run%%:*} backend=${run#*:}
  echo "== $dtype $backend"
  timeout 150 python3 -m edgemoe.cli bench decode --model random:qwen3-30b-a3b --gpu-memory 16GiB --kv-tokens 8192 \
    --routing synthetic --moe-backend "$backend" --expert-dtype "$dtype" --prompt-tokens 1024 --batch-sizes 1 \
    --decode-tokens "${DECODE:-320}" --out "$res" 2>&1 | grep -i "moe \(hybrid\|auto\)\|decode\|captured\|Error" | tail -6
  python3 - "$res" <<'PY'
import glob, json, os, sys
path = max(glob.glob(os.path.join(sys.argv[1], "decode-*.json")), key=os.path.getmtime)
d = json.load(open(path)); r = d["rows"][-1]; m = d["moe"]["final"]
print({k: m.get(k) for k in ("cpu_quota_unit", "cpu_quota_per_layer", "cpu_quota_settled", "cpu_quota_step_ms", "cpu_us_per_call")},
      "decode", round(r["decode_tok_s"], 2), "tok/s p50", round(r["decode_step_ms_p50"], 2), "ms misses/tok",
      round(r["decode_moe"]["misses_per_token"], 1), "cpu", r["decode_moe"]["experts_cpu"], os.path.basename(path))
each = r["decode_step_ms_each"]  # the slowest steps and where they fell; the quota's windows (level, ms) in order
print("  slowest steps (index, ms):", sorted(enumerate(each), key=lambda s: -s[1])[:5],
      "windows:", " ".join(f"{lv:g}:{ms:.2f}" for lv, ms in m.get("cpu_quota_history") or []))
for s in r.get("decode_slow_steps", [])[:4]:  # where each slow step's time went (engine/step_anatomy.py)
    print("  slow step", s)
print("  phases over the run:", r.get("decode_phase_ms"))
PY
done
save_jit_cache
