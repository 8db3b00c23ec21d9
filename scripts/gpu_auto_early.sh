#!/usr/bin/env bash
# Issue 13's `auto` target: what makes auto's early slow decode steps (2026-12-05: steps 3-6
# at 68 / 33 / 36 / 12 ms in one run of two, all in the host's *complete* phase). Each run is
# its own process of `bench decode` (the 16 GiB scenario, synthetic routing, a 1K prompt,
# $DECODE decode tokens), interleaved: $RUNS (dtype:backend) x $ROUNDS, each with the engine
# thread spinning and sleeping on a step's result (EDGEMOE_BLOCKING_WAIT=0 / 1). Each slow
# step says the device's span of the step it completed and the engine thread's involuntary
# switches (engine/step_anatomy.py): a long span is the device's time, a short one with
# switches the host's. auto runs once per entry of $AUTO_ENVS (NAME=VALUE, or several
# joined by commas; default: the bell's quiet polling off and on, EDGEMOE_BELL_QUIET), and so does
# hybrid (a detached-call A/B: AUTO_ENVS="EDGEMOE_CPU_DEFINES=EM_DETACH=0 EDGEMOE_TREE=new"); offload
# once a round. $HOG (0): that many busy-looping processes beside every run (a host whose CPU
# time goes elsewhere, as a user's desktop or a busy VM host; each run's offload sees them too),
# starting once the run's log shows $HOG_WHEN (an extended regex; default "slots preloaded": the
# model is loaded and the engine built; 2026-12-05 16:25, 4 hogs from the start: torch's loading
# threads made the experts at 4 s a layer, and every run timed out; until 19:40 "48/48", which
# tqdm's bar does not always print: in three runs of ten the hogs never started). Each run's
# decode_host counters say whether they ran (the host's busy cores against this process's).
# A table at the end. Through the device tool:
#   run(command="ROUNDS=2 WAITS=0 scripts/gpu_auto_early.sh", carry=[".whl"], timeout_s=600)
#   run(command="ROUNDS=3 WAITS=0 AUTO_ENVS='EDGEMOE_CPU_SPIN_US=200 EDGEMOE_CPU_SPIN_US=2000' scripts/gpu_auto_early.sh", ...)
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
res=$OUT/r; mkdir -p "$res"
arms=${AUTO_ENVS:-EDGEMOE_BELL_QUIET=0 EDGEMOE_BELL_QUIET=1}; last_arm=${arms##* }
for round in $(seq 1 "${ROUNDS:-3}"); do
  for run in ${RUNS:-int4:offload int4:auto}; do
    for arm in $(for bw in ${WAITS:-0 1}; do for a in $arms; do echo "$bw:$a"; done; done); do
      bw=${arm%%:*} envs=${arm#*:} dtype=${run%%:*} backend=${run#*:}
      [ "$backend" = offload ] && [ "$envs" != "$last_arm" ] && continue  # the arms are auto's and hybrid's: offload once
      [ "$backend" = offload ] && envs=""
      dir=$res/$round-$dtype-$backend-bw$bw-$(echo "$envs" | tr -c 'A-Za-z0-9_\n' '-' | sed 's/EDGEMOE_//g')
      mkdir -p "$dir"
      # the GPU's power state and clocks every 50 ms (read-only): a memory-clock switch stalls the device
      nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader \
        -lms 50 > "$dir/clocks.csv" 2>/dev/null & smi=$!
      hogs=(); for _ in $(seq 1 "${HOG:-0}"); do sh -c "until grep -qE '${HOG_WHEN:-slots preloaded}' '$dir/log' 2>/dev/null; do sleep 0.2; done; while :; do :; done" & hogs+=($!); done
      env EDGEMOE_BLOCKING_WAIT=$bw $(echo "$envs" | tr ',' ' ') timeout 150 python3 -m edgemoe.cli bench decode --model random:qwen3-30b-a3b \
        --gpu-memory 16GiB --kv-tokens 8192 --routing synthetic --moe-backend "$backend" --expert-dtype "$dtype" \
        --prompt-tokens 1024 --batch-sizes 1 --decode-tokens "${DECODE:-320}" --out "$dir" > "$dir/log" 2>&1 \
        || { echo "== $dir failed"; tail -5 "$dir/log"; }
      kill $smi "${hogs[@]}" 2>/dev/null; wait $smi "${hogs[@]}" 2>/dev/null
    done
  done
done
python3 - "$res" <<'PY'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "decode-*.json"))):
    d = json.load(open(path)); r = d["rows"][-1]; m = d["moe"]["final"]
    host = r.get("decode_host") or {}
    print(os.path.basename(os.path.dirname(path)), "tok/s", round(r["decode_tok_s"], 1), "p50",
          round(r["decode_step_ms_p50"], 2), "invol", host.get("ctx_switches_involuntary"),
          "settled", m.get("cpu_quota_settled"), "phases", r.get("decode_phase_ms"))
    print("    first steps (ms):", [round(x) for x in r["decode_step_ms_each"][:24]],
          "windows:", (m.get("cpu_quota_history") or [])[:6], "cpu", (r.get("decode_moe") or {}).get("experts_cpu"),
          "pool", m.get("cpu_pool"))
    for s in r.get("decode_slow_steps", [])[:5]:
        print("   ", s)
    rows = [line.split(", ") for line in open(os.path.join(os.path.dirname(path), "clocks.csv")) if line.count(",") >= 5]
    changes = [rows[0]] + [b for a, b in zip(rows, rows[1:]) if (a[1], a[3]) != (b[1], b[3])] if rows else []
    print("    power state / memory clock changes:", [(c[0][-12:], c[1], c[3]) for c in changes][:12])
PY
tar czf "$OUT/results.tgz" -C "$res" . && rm -rf "$res"  # a call brings back at most 8 files
save_jit_cache
