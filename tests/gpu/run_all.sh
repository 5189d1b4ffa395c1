#!/usr/bin/env bash
# Everything issue 7 measures, on one GPU machine, in one command (about 8 minutes on an H200).
#
#   bash tests/gpu/run_all.sh [OUT_DIR]
#
# Expects the offline vLLM bundle (../shared/gpu/README.md): either unpacked in $VK (default /tmp/vk),
# or its parts + SHA256SUMS in $VKP (default /tmp/vkp), which this script joins, checks and unpacks.
# TRL wheels trl-1.9.2 / trl-1.10.0 are taken from $VKP (or already installed in /tmp/trl-VERSION).
# On a machine with vLLM and TRL installed normally, set VK=none and TRL_1_9_2 / TRL_1_10_0 to folders
# holding those releases (pip install --no-deps --target DIR trl==VERSION).
#
# Order on the GPU (imports of all processes overlap; device work is ordered by marker files, each phase
# after every earlier one, and one device lock, tests/gpu/devlock.py, held by each GPU process to its exit):
#   1. bench/gpu_trl_5312.py    5 GRPO runs one by one, tiny model (#5312 with/without shim, TRL 1.10.0)
#   2. bench/gpu_step_cost.py   3 GRPO runs one by one, wide model (s/step, sleep/wake as TRL drives it)
#   3. bench/gpu_sleep_memory.py 6 engines one by one, wide model (freed vs pool, routes, graphs, timing)
#   4. bench/gpu_verify_weights.py, bench/gpu_shim_time.py, bench/gpu_trl_lora.py, bench/gpu_log_volume.py
#      (PHASES verify shimtime lora logs; lora: TRL 1.16.0 + PEFT LoRA, the wheel trl-1.16.0 in $VKP)
#   5. pytest tests/gpu on the results; then examples/trl_grpo_colocate.py if time is left
# Runs that could not finish before BUDGET_S (default 520 s after start) are skipped and say so.
# Knobs: PHASES ("trl5312 cost sleep"; also verify, shimtime, logs), SLEEP_ONLY (configs of the sleep phase), COST_ARGS (e.g. "--with-trl-only --with-bug"), RUN_EXAMPLE (1),
# STEPS_5312 (6), STEPS_COST (8), CYCLES (8 sleep/wake cycles per level), SIZE_WIDE (wide),
# ALLOW_FAKE=1 with tests/fakevllm on PYTHONPATH and VK=none: a dry run of this script on CPU.
# OUT_DIR receives: run_all.log, gpu_trl_5312.json, gpu_step_cost.json, gpu_sleep_memory.json,
# sleep_trace.png, pytest.txt, logs.tar.gz (7 files).
set -u
T0=$(date +%s)
OUT=${1:-${OUT:-/tmp/shim-gpu/out}}
BUDGET_S=${BUDGET_S:-520}
export SHIM_GPU_DEADLINE=$((T0 + BUDGET_S))
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
W=${WORK:-/tmp/shim-gpu}
VK=${VK:-/tmp/vk}
VKP=${VKP:-/tmp/vkp}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/run_all.log") 2>&1
el() { echo "[run_all +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( SHIM_GPU_DEADLINE - $(date +%s) )); }

# ---- 1. vLLM bundle + TRL -------------------------------------------------------------------
if [ "$VK" != none ]; then
  if [ ! -f "$VK/site/vllm/__init__.py" ]; then
    el "unpacking the bundle from $VKP into $VK"
    mkdir -p "$VK"
    ( cd "$VKP" && cat bundle.tar.xz.part-* > bundle.tar.xz && sha256sum -c --quiet SHA256SUMS ) \
      || { el "UNPACK FAILED: parts missing or corrupt in $VKP"; ls -la "$VKP"; exit 1; }
    if command -v xz >/dev/null; then tar -xJf "$VKP/bundle.tar.xz" -C "$VK"
    else python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$VKP/bundle.tar.xz" "$VK"; fi \
      || { el "UNPACK FAILED"; exit 1; }
    rm -f "$VKP"/bundle.tar.xz "$VKP"/bundle.tar.xz.part-*
  fi
  # shellcheck disable=SC1091
  source "$VK/kit/env.sh" || exit 1
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0} WANDB_DISABLED=true
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
for v in 1.9.2 1.10.0; do
  var=TRL_${v//./_}
  dir=${!var:-/tmp/trl-$v}
  if [ ! -f "$dir/trl/__init__.py" ]; then
    python3 -m pip install -q --no-deps --no-index --target "$dir" "$VKP/trl-$v-py3-none-any.whl" \
      || { el "cannot install TRL $v from $VKP"; exit 1; }
  fi
  eval "TRLDIR_${v//./_}=$dir"
done
TRLARGS=(--trl-path "1.9.2=$TRLDIR_1_9_2" --trl-path "1.10.0=$TRLDIR_1_10_0")
# TRL 1.16.0 for the lora phase (its wheel beside the bundle's parts; the machine has peft)
TRLDIR_1_16_0=${TRL_1_16_0:-/tmp/trl-1.16.0}
if [[ " ${PHASES:-} " == *" lora "* ]] && [ ! -f "$TRLDIR_1_16_0/trl/__init__.py" ]; then
  python3 -m pip install -q --no-deps --no-index --target "$TRLDIR_1_16_0" "$VKP/trl-1.16.0-py3-none-any.whl" \
    || { el "cannot install TRL 1.16.0 from $VKP"; exit 1; }
fi
cd "$REPO" || exit 1
el "repo $REPO, out $OUT, budget ${BUDGET_S}s"
reason=$(python3 -c "from tests.gpu import common; print(common.skip_reason() or '')")
[ -z "$reason" ] || [ "${ALLOW_FAKE:-0}" = 1 ] || { el "cannot run: $reason"; exit 1; }
STEPS_5312=${STEPS_5312:-6} STEPS_COST=${STEPS_COST:-8} CYCLES=${CYCLES:-8} SIZE_WIDE=${SIZE_WIDE:-wide}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
if [ -f patches/vllm_sleep_guard.py ]; then el "vLLM guard present: $(python3 -m shim status 2>/dev/null | grep -c vllm) vllm rows"; fi

# ---- 2. models (before any measurement) -----------------------------------------------------
el "making the models"
python3 - "$W" "$SIZE_WIDE" <<'EOF' || { el "model build failed"; exit 1; }
import sys
from tests.gpu import common
w, wide = sys.argv[1], sys.argv[2]
for name, size in (("tiny", "tiny"), ("wide", wide)):
    path = common.make_model(f"{w}/{name}", size)
    print(name, path, common.model_info(path)["params"], "parameters")
EOF

# ---- 3. the benchmarks, chained (PHASES picks some: trl5312 cost sleep) ------------------------
# Each phase waits for the markers of EVERY phase before it (AFTER grows), not only the one just before:
# a phase left out touches its marker at once, so waiting for that one alone let the next phase start
# beside the earlier ones (issue 30: PHASES="trl5312 sleep" ran the sleep phase's engines during the
# trl5312 runs; vLLM's "Memory usage increased after sleeping" killed "1.9.2 sleep on"). On top of the
# markers every GPU process holds one device lock (tests/gpu/devlock.py, $SHIM_GPU_LOCK) from before
# its first device work to its exit; its events file gives the device order printed at the end.
PHASES=" ${PHASES:-trl5312 cost sleep} "
IFS=',' read -r -a VERIFY_ONLY_LIST <<< "${VERIFY_ONLY:-}"   # comma-separated labels
rm -f "$W"/A.done "$W"/B.done "$W"/M.done "$W"/V.done "$W"/T.done "$W"/R.done "$W"/L.done
rm -f "$W"/bench_*.txt  # (printed at the end: none left from an earlier call's phases)
export SHIM_GPU_LOCK="$W/device.lock"
rm -f "$SHIM_GPU_LOCK.events"
el "launching:${PHASES}(in that order on the GPU; device lock $SHIM_GPU_LOCK)"
PIDS=() AFTER=()
# launch NAME TXT TOUCH CMD...: CMD in the background as phase NAME (SHIM_GPU_PHASE, in its device-lock
# events), output to $W/TXT; TOUCH (or -) is a marker written once CMD has exited; a log line at the end
launch() {
  local name=$1 txt=$2 touch_=$3; shift 3
  ( SHIM_GPU_PHASE=$name "$@" > "$W/$txt" 2>&1; rc=$?; [ "$touch_" = - ] || touch "$W/$touch_"
    el "phase $name ended (exit $rc)" ) &
  PIDS+=($!); el "phase $name launched; its device work waits for: ${AFTER[*]:-nothing}"
}
skip() { touch "$W/$2"; el "phase $1 not in PHASES: $2 written"; AFTER+=("$W/$2"); }
if [[ $PHASES == *" trl5312 "* ]]; then
  launch trl5312 bench_trl5312.txt - python3 bench/gpu_trl_5312.py "${TRLARGS[@]}" --model "$W/tiny" \
    --workdir "$W/trl5312" --steps "$STEPS_5312" --out "$OUT/gpu_trl_5312.json" --done "$W/A.done"
  AFTER+=("$W/A.done")
else skip trl5312 A.done; fi
if [[ $PHASES == *" cost "* ]]; then
  # shellcheck disable=SC2086
  launch cost bench_cost.txt - python3 bench/gpu_step_cost.py "${TRLARGS[@]}" --model "$W/wide" --workdir "$W/cost" \
    --after "${AFTER[@]}" --steps "$STEPS_COST" ${COST_ARGS:-} --out "$OUT/gpu_step_cost.json" \
    --plot "$OUT/sleep_trace.png" --done "$W/B.done"
  AFTER+=("$W/B.done")
else skip cost B.done; fi
if [[ $PHASES == *" sleep "* ]]; then
  # shellcheck disable=SC2086
  launch sleep bench_sleep.txt - python3 bench/gpu_sleep_memory.py --model "$W/wide" --workdir "$W/sleep" \
    --after "${AFTER[@]}" --cycles "$CYCLES" ${SLEEP_ONLY:+--only $SLEEP_ONLY} --out "$OUT/gpu_sleep_memory.json" \
    --done "$W/M.done"
  AFTER+=("$W/M.done")
else skip sleep M.done; fi
if [[ $PHASES == *" verify "* ]]; then
  # SIZE_VERIFY=big: the ~3.3 B model (made in $W/verify/big); VERIFY_ONLY: labels of the runs to do
  # shellcheck disable=SC2086
  launch verify bench_verify.txt - python3 bench/gpu_verify_weights.py "${TRLARGS[@]}" \
    $([ "${SIZE_VERIFY:-wide}" = wide ] && echo --model "$W/wide" || echo --size "$SIZE_VERIFY") \
    --workdir "$W/verify" --after "${AFTER[@]}" --steps "${STEPS_VERIFY:-8}" ${VERIFY_ONLY:+--only} \
    "${VERIFY_ONLY_LIST[@]}" --out "$OUT/gpu_verify_weights${SIZE_VERIFY:+_$SIZE_VERIFY}.json" --done "$W/V.done"
  AFTER+=("$W/V.done")
else skip verify V.done; fi
if [[ $PHASES == *" shimtime "* ]]; then
  # its marker once the process is gone (its CUDA context freed): vLLM's start-up profiling in the next run
  # fails when device memory is given back during it
  launch shimtime bench_shimtime.txt T.done python3 bench/gpu_shim_time.py --model "$W/wide" --after "${AFTER[@]}" \
    --cycles "${CYCLES_TIME:-20}" --out "$OUT/gpu_shim_time.json"
  AFTER+=("$W/T.done")
else skip shimtime T.done; fi
if [[ $PHASES == *" lora "* ]]; then
  launch lora bench_lora.txt - python3 bench/gpu_trl_lora.py --trl-path "1.16.0=$TRLDIR_1_16_0" --model "$W/tiny" \
    --workdir "$W/lora" --after "${AFTER[@]}" --steps "${STEPS_LORA:-6}" --out "$OUT/gpu_trl_lora.json" \
    --done "$W/R.done"
  AFTER+=("$W/R.done")
else skip lora R.done; fi
if [[ $PHASES == *" logs "* ]]; then
  launch logs bench_logs.txt - python3 bench/gpu_log_volume.py "${TRLARGS[@]}" --model "$W/wide" --workdir "$W/logs" \
    --after "${AFTER[@]}" --steps "${STEPS_LOGS:-100}" --out "$OUT/gpu_log_volume.json" --done "$W/L.done"
  AFTER+=("$W/L.done")
fi
# watchdog: nothing may run past the budget + 35 s (the device call's limit is 600 s). Its output goes to the
# log file, not to this script's stdout, so that a sleeping watchdog never keeps the caller's pipe open.
# (a phase is a subshell > orchestrator > runs: the whole tree, by process id)
killtree() { local c; for c in $(pgrep -P "$1"); do killtree "$c"; done; kill "$1"; }
( sleep $(( $(left) + 35 )); echo "[run_all] WATCHDOG: killing what is left" >> "$OUT/run_all.log"
  for p in "${PIDS[@]}"; do killtree "$p"; done ) > /dev/null 2>&1 &
WD=$!
for p in "${PIDS[@]}"; do wait "$p"; done
pkill -P "$WD" 2>/dev/null; kill "$WD" 2>/dev/null
if [ -f "$SHIM_GPU_LOCK.events" ]; then
  el "device order (tests/gpu/devlock.py, $SHIM_GPU_LOCK.events):"
  python3 -m tests.gpu.devlock "$SHIM_GPU_LOCK.events"
  el "device overlap check exit $?"
fi
for f in bench_trl5312 bench_cost bench_sleep bench_verify bench_shimtime bench_lora bench_logs; do [ -f "$W/$f.txt" ] && { el "==== $f"; cat "$W/$f.txt"; }; done

# ---- 4. tests on the results, example, logs --------------------------------------------------
el "pytest tests/gpu on the results"
SHIM_GPU_RESULTS="$OUT" python3 -m pytest -q -rA -p no:cacheprovider tests/gpu > "$OUT/pytest.txt" 2>&1
el "pytest exit $?: $(tail -1 "$OUT/pytest.txt")"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)" "$OUT/pytest.txt" | cut -c1-220
if [ "${RUN_EXAMPLE:-1}" = 1 ] && [ "$(left)" -gt 75 ]; then
  el "examples/trl_grpo_colocate.py (TRL 1.9.2)"
  timeout $(( $(left) + 20 )) python3 examples/trl_grpo_colocate.py --trl-path "$TRLDIR_1_9_2" --model "$W/tiny" \
    --workdir "$W/example" --steps "$STEPS_5312" ${ALLOW_FAKE:+--pythonpath "$PYTHONPATH"} 2>&1 | grep -v -E "^(INFO|WARNING|\[shim)" | tail -20
else
  el "examples/trl_grpo_colocate.py skipped: $(left) s left"
fi
( cd "$W" && find . -name '*.log' -o -name '*.json' -o -name '*.jsonl' -o -name '*.events' -o -name 'bench_*.txt' | grep -v -E '/(tiny|wide)/|trainer-' \
  | tar czf "$OUT/logs.tar.gz" -T - )
el "done; files in $OUT:"; ls -la "$OUT"
sleep 1  # let tee write the last lines
