#!/usr/bin/env bash
# Several GPU jobs in one device call (a call costs a machine start), each under its own
# time limit, so one that hangs or overruns leaves the rest their time. Everything they
# write comes back as $OUT/results.tgz (a call returns at most 8 files) with the JIT cache
# parts (scripts/gpu_env.sh). Stages, in the order named:
#   tests-rerun  the GPU tests named in $TESTS (default: the whole suite)
#   isolated     each test in $ISOLATED in a process of its own (what @isolated does), with
#                every thread's stack dumped if one runs past 120 s (faulthandler)
#   hotpath      resident decode, random:qwen3-30b-a3b bf16: 1K/8K prompts x batch 1/8/32, profiled
#   hotpath32k   resident decode at a 32K prompt, batch 1
#   engine-ab    resident decode at 1K and 32K, batch 1 ($AB_PROMPTS, $AB_BATCHES replace them), once per setting in $AB (settings split by
#                ";", each "[VAR=value ...] [--flag value ...]": environment, then bench decode flags;
#                e.g. decode attention tile sets: AB="EDGEMOE_ATTN_DECODE_TILES=64,64,4,2,8,1;EDGEMOE_ATTN_DECODE_TILES=...")
#   dsweep       scripts/gpu_dense_gemv_sweep.py $DSWEEP (the decode-path dense projections vs cuBLAS)
#   prefill-ab   8K prompt, batch 1, resident: prefill with overlap, then --no-overlap (one process each)
#   pdl          resident decode at 1K, batch 1 and 8, profiled: EDGEMOE_PDL=1, then 0 (one process each;
#                programmatic dependent launch of the decode step's Triton kernels, docs/kernels.md)
#   kbench       scripts/gpu_kernel_bench.py $KBENCH (e.g. "--only attention_sweep moe_q_sweep"): every Triton kernel at
#                Qwen3-30B-A3B shapes by default (the router sweep too)
#   kprofile     scripts/gpu_kernel_profile.py: a resident decode step's kernels ($KPROFILE: "batch prompt [k=v ...]",
#                several runs split by ";", one process each)
#   offload16    the 16 GiB offload scenario (auto backend) at 1K
#   prefill16    issue 13's prefill targets: 8K and 32K prompts under the 16 GiB scenario, synthetic
#                routing, $PREFILL16 backends (default offload hybrid) x $PREFILL_RUNS ("prompts:kv tokens:chunk"
#                [:expert dtype[:flags, "+"-joined]] each, default "8192,32768:40960:8192")
#   lend-ab      the 8K prompt in one 8K chunk and the decode after it, with the slot pool's tail lent to
#                the chunk (EDGEMOE_LEND_SLOTS=1: more slots) and without, per $LEND_AB ($LEND_BACKEND, $LEND_DECODE)
#   stream-ab    short prompts ($STREAM_AB_PROMPTS: 512 700) streamed or planned: EDGEMOE_PREFILL_STREAM_TOKENS in $STREAM_AB
#   prefetch-ab  issue 13's decode scenario (16 GiB, synthetic routing, 1K prompt) per $PREFETCH_RUNS
#                ("dtype:backend:on|off[:VAR=value[+VAR=value...][:flags, "+"-joined]]" each; an empty VAR
#                field is "::"), $PREFETCH_DECODE tokens (240), each run at most $RUN_LIMIT s (900)
#   tree-ab      a build against another, interleaved, one process each: issue 13's decode scenario
#                (or `bench decode` flags in $TREE_ARGS) per tree in $TREES (default "ab-tree ."), $TREE_ROUNDS
#                rounds (2); a tree is a directory holding src/ (scripts/ab_tree.sh REV extracts REV's to ab-tree/,
#                ignored by git: carry=[".whl", "ab-tree"])
#   prefetch-sweep  scripts/gpu_prefetch_sweep.py per $SWEEP_BACKENDS (hybrid): the side gather's grids in one
#                engine ($PREFETCH_SWEEP: its flags, e.g. "--grids 32,2048,4 64,8192,8")
#   bw           edgemoe bench bw $BW (host read, CPU experts per format through the entry point and as C calls alone, copies)
#   harness      scripts/cpu_gemv_harness.c per "threads,reps,pf,pages" in $HARNESS: the GEMV inner loops'
#                streaming rates per core (int8 cvt / int16 madd / vnni, read-only, bf16)
#   amx-probe    scripts/amx_tile_probe.c per "threads,tokens" in $AMX_PROBE (1,16 8,16 16,16 1,32 16,32): the
#                AMX blocked path's k-step built up a piece at a time (products, tile loads, conversion, RAM); 8 threads beside 16 tell a core shared by two of its threads
#   phases       scripts/cpu_phase_times.py per run in $PHASES (split by ";"): a CPU expert call's phases and threads (late entry,
#                each phase's span and rate, its slowest task's tail), per weight format
#   cpu-ab       scripts/gpu_cpu_ab.py $CPU_AB: kernel builds interleaved in one process (e.g.
#                CPU_AB='--builds "EM_QPAGES=0" "" --rounds 12')
#   turn         scripts/gpu_turn_ttft.py per $TURN_BACKENDS (offload hybrid): a 300-token turn's TTFT after a
#                cached 30K prefix, $TURN_ARGS
#   share-ab     scripts/gpu_cpu_share_ab.py per run in $SHARE_AB (split by ";", one process each; e.g.
#                "--prompt-ab 300 700;--expert-dtype fp8 --prompt-ab 512 --gemm-ns 0 6000")
#   share-live   scripts/gpu_share_live.sh's engine runs only ($RUNS dtype:backend pairs, $DECODE tokens)
#   plan-check   `edgemoe plan`'s checks (issue 17, docs/plan.md): bf16 16 GiB, fp8 16 GiB, bf16 8 GiB at 1K, the model's router
#   scan-ab      bf16 at 8 GiB (276 slots < 48 x 8): --moe-policy lru (scan-resistant), then lru-plain (one process each)
#   offload2     scripts/gpu_offload2.sh (expert cache host / device-gather / device-copy)
#   hybrids      scripts/gpu_hybrids_bench.sh PART=decode
#   qwen4        scripts/gpu_qwen4_bench.py $QWEN4_ARGS
#   shared-read  scripts/gpu_shared_read.py $SHARED_READ: do the CPU's expert reads and the device's copies of the
#                same experts share the host's memory reads?
#   mma-probe    scripts/int4_mma_probe.py: the int4 decode GEMV on tensor cores against the engine's launches
# Through the device tool:
#   run(command="STAGES='hotpath offload2' LIMITS='240 300' scripts/gpu_stages.sh", carry=[".whl"])
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
res=/tmp/stage-results
mkdir -p "$res"
model="random:qwen3-30b-a3b"
decode() { python3 -m edgemoe.cli bench decode --model "$model" --profile --profile-steps 8 "$@"; }

run_stage() {
  case "$1" in
    tests-rerun) python3 -m pytest ${TESTS:-tests/gpu} -q -p no:cacheprovider -o addopts="--import-mode=importlib" -rfE --tb=short ;;
    isolated) for t in $ISOLATED; do
                EDGEMOE_ISOLATED_TEST=1 python3 -m pytest "$t" -q -p no:cacheprovider -o addopts="--import-mode=importlib" \
                  -o faulthandler_timeout=120 -rfE --tb=short
              done ;;
    hotpath) decode --moe-backend resident --prompt-tokens 1024 8192 --batch-sizes 1 8 32 --decode-tokens 32 --out "$res/hotpath" ;;
    hotpath32k) decode --moe-backend resident --prompt-tokens 32768 --batch-sizes 1 --decode-tokens 32 \
                  --max-prefill-tokens 8192 --out "$res/hotpath32k" ;;
    engine-ab) IFS=';' read -r -a settings <<< "${AB:-}"
               for setting in "${settings[@]}"; do
                 vars=(); flags=()
                 for word in $setting; do
                   if [[ $word == *=* && $word != --* ]]; then vars+=("$word"); else flags+=("$word"); fi
                 done
                 echo "== ${setting:-defaults}"
                 env "${vars[@]}" python3 -m edgemoe.cli bench decode --model "$model" --profile --profile-steps 8 \
                   --moe-backend resident --prompt-tokens ${AB_PROMPTS:-1024 32768} --batch-sizes ${AB_BATCHES:-1} --decode-tokens 32 \
                   --max-prefill-tokens 8192 "${flags[@]}" --out "$res/engine-ab"
               done ;;
    dsweep) OUT="$res/dsweep" python3 scripts/gpu_dense_gemv_sweep.py ${DSWEEP:-} ;;
    kprofile) IFS=';' read -r -a runs <<< "${KPROFILE:-1 1024}"  # runs split by ";", one process each
              for run in "${runs[@]}"; do echo "== $run"; OUT="$res/kprofile" python3 scripts/gpu_kernel_profile.py $run; done ;;
    prefill-ab) for ov in --overlap --no-overlap; do
                  decode --moe-backend resident --prompt-tokens 8192 --batch-sizes 1 --decode-tokens 8 $ov \
                    --out "$res/prefill-ab"
                done ;;
    pdl) for flag in 1 0; do
           echo "== EDGEMOE_PDL=$flag"
           EDGEMOE_PDL=$flag decode --moe-backend resident --prompt-tokens 1024 --batch-sizes 1 8 --decode-tokens 32 \
             --out "$res/pdl/pdl$flag"
         done ;;
    kbench) OUT="$res/kbench" python3 scripts/gpu_kernel_bench.py ${KBENCH:-} ;;
    offload16) decode --gpu-memory 16GiB --kv-tokens 8192 --prompt-tokens 1024 --batch-sizes 1 --decode-tokens 32 \
                 --out "$res/offload16" ;;
    prefill16) for backend in ${PREFILL16:-offload hybrid}; do
                 for spec in ${PREFILL_RUNS:-8192,32768:40960:8192}; do  # prompts:kv tokens:chunk[:expert dtype[:flags]]
                   IFS=: read -r prompts kv chunk dtype flags <<< "$spec"  # flags: "+"-joined, e.g. --expert-preload+off
                   echo "== $backend, prompts $prompts, kv $kv, chunks of $chunk, experts ${dtype:-bf16} ${flags:-}"
                   decode --gpu-memory 16GiB --kv-tokens "$kv" --routing synthetic --moe-backend "$backend" \
                     --expert-dtype "${dtype:-bf16}" --prompt-tokens ${prompts//,/ } --batch-sizes 1 --decode-tokens 8 \
                     --max-prefill-tokens "$chunk" ${flags//+/ } --out "$res/prefill16"
                 done
               done ;;
    lend-ab) for lend in ${LEND_AB:-0 1}; do  # EDGEMOE_LEND_SLOTS: the slot pool's tail lent to long chunks, or not
               echo "== EDGEMOE_LEND_SLOTS=$lend"
               EDGEMOE_LEND_SLOTS=$lend decode --gpu-memory 16GiB --kv-tokens 8448 --routing synthetic \
                 --moe-backend ${LEND_BACKEND:-offload} --prompt-tokens 8192 --batch-sizes 1 \
                 --decode-tokens ${LEND_DECODE:-160} --max-prefill-tokens 8192 --out "$res/lend-ab"
             done ;;
    stream-ab) for threshold in ${STREAM_AB:-256 1024}; do  # EDGEMOE_PREFILL_STREAM_TOKENS for short prompts
                 echo "== EDGEMOE_PREFILL_STREAM_TOKENS=$threshold"
                 EDGEMOE_PREFILL_STREAM_TOKENS=$threshold decode --gpu-memory 16GiB --kv-tokens 8192 --routing synthetic \
                   --moe-backend offload --prompt-tokens ${STREAM_AB_PROMPTS:-512 700} --batch-sizes 1 --decode-tokens 8 \
                   --out "$res/stream-ab/t$threshold"
               done ;;
    bw) python3 -m edgemoe.cli bench bw --out "$res/bw" ${BW:-} ;;
    harness) cc -O3 -march=native -o /tmp/harness scripts/cpu_gemv_harness.c -lpthread && mkdir -p "$res/harness" &&
             for args in ${HARNESS:-4,3,8,1 8,3,8,1 16,3,8,1 16,3,8,0 16,3,0,1}; do /tmp/harness ${args//,/ }; done \
               | tee "$res/harness/harness.jsonl" ;;
    amx-probe) cc -O3 -march=native -Isrc/edgemoe/kernels/cpu -o /tmp/amx_probe scripts/amx_tile_probe.c -lpthread &&
               mkdir -p "$res/amx-probe" &&  # THREADS,TOKENS runs (scripts/amx_tile_probe.c), 0.3 s a mode
               for args in ${AMX_PROBE:-1,16 8,16 16,16 1,32 16,32}; do /tmp/amx_probe ${args//,/ } 0.3; done \
                 | tee "$res/amx-probe/amx-probe.jsonl" ;;
    phases) IFS=';' read -r -a runs <<< "${PHASES:-}"  # runs split by ";", one process each
            for run in "${runs[@]:-}"; do OUT="$res/phases" python3 scripts/cpu_phase_times.py $run; done ;;
    cpu-ab) eval "OUT=$res/cpu-ab python3 scripts/gpu_cpu_ab.py ${CPU_AB:-}" ;;
    prefetch-ab) for run in ${PREFETCH_RUNS:-bf16:hybrid:off bf16:hybrid:on}; do  # dtype:backend:prefetch[:VAR=value[:flags]]
                   IFS=: read -r dtype backend pf setting flags <<< "$run"  # flags "+"-joined, e.g. --expert-preload+off
                   echo "== $dtype $backend --moe-prefetch $pf $setting ${flags:-}"
                   env ${setting//+/ } timeout "${RUN_LIMIT:-900}" python3 -m edgemoe.cli bench decode --model "$model" \
                     --gpu-memory 16GiB --kv-tokens 8192 \
                     --routing synthetic --moe-backend "$backend" --expert-dtype "$dtype" --moe-prefetch "$pf" \
                     --prompt-tokens 1024 --batch-sizes 1 --decode-tokens ${PREFETCH_DECODE:-240} ${flags//+/ } \
                     --out "$res/prefetch-ab"
                 done ;;
    tree-ab) for round in $(seq "${TREE_ROUNDS:-2}"); do
               for tree in ${TREES:-ab-tree .}; do  # the wheels first, then the tree's sources
                 echo "== round $round, tree $tree"
                 PYTHONPATH="/tmp/site:$PWD/$tree/src:$PWD" python3 -m edgemoe.cli bench decode --model "$model" \
                   ${TREE_ARGS:---gpu-memory 16GiB --kv-tokens 8192 --routing synthetic --moe-backend hybrid
                     --prompt-tokens 1024 --batch-sizes 1 --decode-tokens 240} --out "$res/tree-ab/${tree//[^A-Za-z0-9]/_}"
               done
             done ;;
    prefetch-sweep) for backend in ${SWEEP_BACKENDS:-hybrid}; do
                      OUT="$res/prefetch-sweep" python3 scripts/gpu_prefetch_sweep.py --backend "$backend" ${PREFETCH_SWEEP:-}
                    done ;;
    turn) for backend in ${TURN_BACKENDS:-offload hybrid}; do
            for setting in ${TURN_ENVS:-EDGEMOE_PREFILL_STREAM_TOKENS=1024}; do  # one process each
              echo "== $backend $setting"
              env "$setting" OUT="$res/turn/${setting//[^A-Za-z0-9]/_}" python3 scripts/gpu_turn_ttft.py \
                --backend "$backend" ${TURN_ARGS:-}
            done
          done ;;
    share-ab) IFS=';' read -r -a runs <<< "${SHARE_AB:-}"
              for args in "${runs[@]:-}"; do  # one process each
                echo "== $args"
                OUT="$res/share-ab" python3 scripts/gpu_cpu_share_ab.py $args
              done ;;
    share-live) SKIP_TESTS=1 SKIP_AB=1 OUT="$res/share-live" bash scripts/gpu_share_live.sh ;;
    plan-check) for setting in "bf16 16GiB" "fp8 16GiB" "bf16 8GiB"; do
                  set -- $setting
                  decode --expert-dtype "$1" --gpu-memory "$2" --kv-tokens 8192 --prompt-tokens 1024 --batch-sizes 1 \
                    --decode-tokens 64 --out "$res/plan-check"
                done ;;
    scan-ab) for policy in lru lru-plain; do
               echo "== --moe-policy $policy"
               decode --moe-policy "$policy" --gpu-memory 8GiB --kv-tokens 8192 --prompt-tokens 1024 --batch-sizes 1 \
                 --decode-tokens 64 --out "$res/scan-ab/$policy"
             done ;;
    offload2) OUT="$res/offload2" bash scripts/gpu_offload2.sh ;;
    hybrids) OUT="$res/hybrids" PART=decode bash scripts/gpu_hybrids_bench.sh ;;
    qwen4) OUT="$res/qwen4" python3 scripts/gpu_qwen4_bench.py ${QWEN4_ARGS:-} ;;
    shared-read) mkdir -p "$res/shared-read" && OUT="$res/shared-read" python3 scripts/gpu_shared_read.py ${SHARED_READ:-} ;;
    mma-probe) mkdir -p "$res/mma-probe" && OUT="$res/mma-probe" python3 scripts/int4_mma_probe.py ;;
    *) echo "unknown stage $1"; return 2 ;;
  esac
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
read -r -a limits <<< "${LIMITS:-}"
i=0
for stage in ${STAGES:-tests-rerun}; do
  limit="${limits[$i]:-300}"; i=$((i + 1))
  mkdir -p "$res/$stage"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c "$(declare -f run_stage decode); res=$res model=$model; run_stage $stage" \
    > "$res/$stage.log" 2>&1
  rc=$?
  echo "== $stage rc=$rc $(( $(date +%s) - start )) s (limit $limit)"
  grep -v "it/s\]\|s/it\]" "$res/$stage.log" | tail -n "${TAIL:-25}"
done
if [ -n "${OUT:-}" ]; then tar czf "$OUT/results.tgz" -C "$res" .; fi
save_jit_cache
exit 0
