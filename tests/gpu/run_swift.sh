#!/usr/bin/env bash
# ms-swift 4.6.0 under `python -m shim` on one GPU (issue 13, runs 1 and 2), in one command.
#
#   bash tests/gpu/run_swift.sh [OUT_DIR]                 # on the H200 (device tool), see tests/gpu/README.md
#   bash tests/gpu/run_swift.sh --cpu-dry-run [OUT_DIR]   # here: the same script on CPU, tests/fakevllm as vLLM
#
# GPU: expects the offline vLLM bundle (../shared/gpu/README.md) unpacked in $VK (default /tmp/vk) or its
# parts + SHA256SUMS in $VKP (default /tmp/vkp, joined and unpacked here, as run_all.sh does), and the
# ms-swift wheels of tests/gpu/swift_wheels.sh in $SWW (default: .gpu/swift-wheels of this checkout when
# carried, else /tmp/swift-wheels), installed with pip --no-index --no-deps --target $SW (default /tmp/sw)
# and put BEFORE the bundle's site/ on PYTHONPATH (its datasets 4.8.4 / fsspec / peft 0.20.0 must win).
# Then: two tiny random Qwen2 (policy/student, GKD teacher), bench/gpu_swift.py (every run is ms-swift's
# CLI, NPROC_PER_NODE=1, one after the other), pytest tests/gpu/test_swift_*.py on the results.
#
# Knobs: PHASES ("grpo gkd"), LEVELS ("1,2"), TUNERS ("full,lora"), SHIMS ("off,on"), GKD_SHIMS ("on,off"),
# STEPS (4), GKD_STEPS (3), BUDGET_S (default 540: runs that cannot finish before are skipped and say so).
# Split over device calls (10 min each): PHASES=grpo TUNERS=full, PHASES=grpo TUNERS=lora, PHASES=gkd.
# OUT_DIR receives: run_swift.log, gpu_swift_grpo_<tuners>_L<levels>.json, gpu_swift_gkd.json, pytest_swift.txt,
# swift_logs.tar.gz.
set -u
T0=$(date +%s)
DRY=0
if [ "${1:-}" = --cpu-dry-run ]; then DRY=1; shift; fi
OUT=${1:-${OUT:-/tmp/shim-swift/out}}
BUDGET_S=${BUDGET_S:-540}
export SHIM_GPU_DEADLINE=$((T0 + BUDGET_S))
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
W=${WORK:-/tmp/shim-swift}
mkdir -p "$OUT" "$W"
exec > >(tee -a "$OUT/run_swift.log") 2>&1
el() { echo "[run_swift +$(( $(date +%s) - T0 ))s] $*"; }

if [ "$DRY" = 1 ]; then
  # CPU: the ms-swift 4.6.0 test venv (tests/support/swift_envs.py) and the vLLM stand-in
  PY=${PY:-$REPO/.envs/swift-4.6.0/bin/python}
  [ -x "$PY" ] || { el "no $PY (build it: python -m tests.support.swift_envs 4.6.0)"; exit 1; }
  VK=none
  export PYTHONPATH="$REPO/tests/fakevllm${PYTHONPATH:+:$PYTHONPATH}"
  DRYARG=(--cpu-dry-run)
  PYTEST_PY=${PYTEST_PY:-$REPO/.envs/ci-venv/bin/python}  # the ms-swift venv has no pytest
  STEPS=${STEPS:-2} GKD_STEPS=${GKD_STEPS:-2}
else
  PY=${PY:-python3}
  PYTEST_PY=${PYTEST_PY:-$PY}
  VK=${VK:-/tmp/vk}
  VKP=${VKP:-/tmp/vkp}
  DRYARG=()
  # ---- 1. vLLM bundle ------------------------------------------------------------------------
  if [ "$VK" != none ]; then
    if [ ! -f "$VK/site/vllm/__init__.py" ]; then
      el "unpacking the bundle from $VKP into $VK"
      mkdir -p "$VK"
      ( cd "$VKP" && cat bundle.tar.xz.part-* > bundle.tar.xz && sha256sum -c --quiet SHA256SUMS ) \
        || { el "UNPACK FAILED: parts missing or corrupt in $VKP (the machine went cold? start again with p1)"; ls -la "$VKP"; exit 1; }
      if command -v xz >/dev/null; then tar -xJf "$VKP/bundle.tar.xz" -C "$VK"
      else "$PY" -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$VKP/bundle.tar.xz" "$VK"; fi \
        || { el "UNPACK FAILED"; exit 1; }
      rm -f "$VKP"/bundle.tar.xz "$VKP"/bundle.tar.xz.part-*
    fi
    # shellcheck disable=SC1091
    source "$VK/kit/env.sh" || exit 1
  fi
  # ---- 2. ms-swift wheels (before the bundle on PYTHONPATH) -----------------------------------
  SW=${SW:-/tmp/sw}
  if [ ! -f "$SW/swift/__init__.py" ]; then
    SWW=${SWW:-}
    if [ -z "$SWW" ]; then
      for d in "$REPO/.gpu/swift-wheels" /tmp/swift-wheels; do [ -f "$d/SHA256SUMS" ] && { SWW=$d; break; }; done
    fi
    [ -n "$SWW" ] && [ -f "$SWW/SHA256SUMS" ] || { el "no ms-swift wheels (.gpu/swift-wheels or /tmp/swift-wheels; tests/gpu/swift_wheels.sh builds them)"; exit 1; }
    ( cd "$SWW" && sha256sum -c --quiet SHA256SUMS ) || { el "ms-swift wheels corrupt in $SWW"; exit 1; }
    el "installing $(ls "$SWW"/*.whl | wc -l) wheels from $SWW into $SW"
    "$PY" -m pip install -q --no-index --no-deps --target "$SW" "$SWW"/*.whl || { el "wheel install failed"; exit 1; }
  fi
  export PYTHONPATH="$SW${PYTHONPATH:+:$PYTHONPATH}"
  STEPS=${STEPS:-4} GKD_STEPS=${GKD_STEPS:-3}
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export MODELSCOPE_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0} WANDB_DISABLED=true
export PYTHONPATH="$REPO:$PYTHONPATH"
cd "$REPO" || exit 1
el "repo $REPO, out $OUT, python $PY, budget ${BUDGET_S}s$([ "$DRY" = 1 ] && echo ', CPU DRY RUN (tests/fakevllm)')"
"$PY" - <<'EOF' || { el "imports failed"; exit 1; }
import importlib.metadata as md
import sys
for d in ("ms-swift", "trl", "transformers", "peft", "datasets", "deepspeed", "vllm", "torch", "modelscope"):
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        print(f"  {d} MISSING"); sys.exit(1)
import swift.cli.main, swift.rlhf_trainers.rollout_mixin, deepspeed, vllm  # noqa: E401,F401
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader

# ---- 3. models --------------------------------------------------------------------------------
el "making the models"
"$PY" - "$W" <<'EOF' || { el "model build failed"; exit 1; }
import sys
from tests.gpu import common
w = sys.argv[1]
for name, seed in (("tiny", 0), ("teacher", 1)):
    path = common.make_model(f"{w}/{name}", "tiny", seed=seed)
    print(name, path, common.model_info(path)["params"], "parameters")
EOF

# ---- 4. the runs --------------------------------------------------------------------------------
PHASES=${PHASES:-grpo gkd}
LEVELS=${LEVELS:-1,2}
TUNERS=${TUNERS:-full,lora}
TAG=${TUNERS//,/}_L${LEVELS//,/}
el "bench/gpu_swift.py: phases ${PHASES}, levels ${LEVELS}, tuners ${TUNERS}"
timeout $(( BUDGET_S + 40 - ($(date +%s) - T0) )) "$PY" bench/gpu_swift.py "${DRYARG[@]}" --python "$PY" \
  --model "$W/tiny" --teacher "$W/teacher" --workdir "$W/runs" --phases "${PHASES// /,}" --levels "$LEVELS" \
  --tuners "$TUNERS" --shims "${SHIMS:-off,on}" --gkd-shims "${GKD_SHIMS:-on,off}" \
  --steps "$STEPS" --gkd-steps "$GKD_STEPS" \
  --out-grpo "$OUT/gpu_swift_grpo_$TAG.json" --out-gkd "$OUT/gpu_swift_gkd.json"
el "bench exit $?"

# ---- 5. tests on the results, logs ------------------------------------------------------------------
el "pytest tests/gpu/test_swift_*.py on the results"
SHIM_GPU_RESULTS="$OUT" "$PYTEST_PY" -m pytest -q -rA -p no:cacheprovider tests/gpu/test_swift_grpo.py tests/gpu/test_swift_gkd.py \
  > "$OUT/pytest_swift.txt" 2>&1
el "pytest exit $?: $(tail -1 "$OUT/pytest_swift.txt")"
grep -E "^(PASSED|FAILED|SKIPPED|ERROR)" "$OUT/pytest_swift.txt" | cut -c1-220
( cd "$W/runs" 2>/dev/null && find . -maxdepth 1 \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \) | tar czf "$OUT/swift_logs.tar.gz" -T - )
el "done; files in $OUT:"; ls -la "$OUT"
sleep 1  # let tee write the last lines
