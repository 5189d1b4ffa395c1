#!/usr/bin/env bash
# verl 0.9.1 GRPO, colocated on one GPU, vLLM 0.24.0 rollout with sleep on (issue 21 item 5).
# Two runs of `python3 -m verl.trainer.main_ppo` with the same seeds: plain, then under
# `python -m shim` with SHIM_TRACE and SHIM_VERIFY_WEIGHTS=1. verl's defaults for the sleep
# (free_cache_engine true, enable_sleep_mode true, load_format dummy, calculate_log_probs true).
#
# On the device (calls back to back; see tests/gpu/README.md, ../shared/gpu/README.md). A call returns at
# most 8 files of $OUT (the rest is dropped, and the next call gets an empty $OUT): write to /tmp/oN and tar it.
#   call 1  carry [.gpu/p1]          mkdir -p /tmp/vkp && cp .gpu/p1/* /tmp/vkp/
#   call 2  carry [.gpu/p2, .gpu/v1] mkdir -p /tmp/vkp /tmp/vtp && cp .gpu/p2/* /tmp/vkp/ && cp .gpu/v1/* /tmp/vtp/
#   call 3  carry [.gpu/v2]          mkdir -p /tmp/vtp /tmp/o3 && cp .gpu/v2/* /tmp/vtp/ &&
#                                    PHASES="unpack check plain shim" bash tests/gpu/verl_grpo.sh /tmp/o3; tar -czf $OUT/o3.tgz -C /tmp/o3 .
#   (measured 2026-12-03: unpack+check 60 s, plain 242 s, shim 146-164 s; with DET=1 a run takes about 300 s:
#    give each DET run its own call, e.g. PHASES="unpack check plain" then PHASES=shim)
# (.gpu/p1,p2: the vLLM bundle; .gpu/v1,v2: vt.tar.xz split, verl 0.9.1 + ray 2.60.0 + transformers 5.9.0 +
# tokenizers 0.22.2 + the rest, built by tests/gpu/verl_wheels.sh.) Summary here:
#   python3 tests/gpu/verl_grpo_summary.py DIR   (DIR: the verl091_* files of both runs)
# CPU check of the config keys only: `bash tests/gpu/verl_grpo.sh --compose /tmp/x` (hydra compose, no run).
# Phases drop / dropstrict (issue 30 item 1): as shim (SHIM_VERIFY_WEIGHTS=1), with every weight update inside the
# vLLM worker silently skipping the tensors whose name contains $DROP (default layers.1.mlp.down_proj): the shim
# must report stale weights at every update; dropstrict adds SHIM_STRICT=1 (the run stops at the first update).
# The drop is a sitecustomize in $W/drop (chained by the shim's bootstrap) wrapping Qwen2ForCausalLM.load_weights.
# Knobs: STEPS (4), N (4 samples per prompt), BATCH (8 prompts), W (/tmp/verlrun), VK (/tmp/vk), VT (/tmp/vt),
# DET=1: actor_rollout_ref.actor.fsdp_config.full_determinism=true (the FSDP engine's enable_full_determinism:
# torch deterministic algorithms, cuBLAS workspace; the rollout side stays as is: per-request seeds of
# verl_grpo_plugin.py), run names get the suffix _det.
# The device sends back only a few files per call: run with OUT=/tmp/oN and tar /tmp/oN into $OUT.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
COMPOSE=0; [ "${1:-}" = "--compose" ] && { COMPOSE=1; shift; }
OUT=${1:?usage: verl_grpo.sh [--compose] OUT_DIR}; mkdir -p "$OUT"
W=${W:-/tmp/verlrun}; VK=${VK:-/tmp/vk}; VT=${VT:-/tmp/vt}
STEPS=${STEPS:-4}; N=${N:-4}; BATCH=${BATCH:-8}
PHASES=${PHASES:-unpack check plain shim}
DET=${DET:-0}; TAG=""; [ "$DET" = 1 ] && TAG=_det
START=$(date +%s); BUDGET=${BUDGET:-575}   # seconds this call may use (device calls stop at 600)

overrides() {  # $1 = run name
  local name=$1
  cat <<EOT
algorithm.adv_estimator=grpo
algorithm.use_kl_in_reward=false
data.train_files=$W/data/train.parquet
data.val_files=$W/data/val.parquet
data.train_batch_size=$BATCH
data.max_prompt_length=64
data.max_response_length=32
data.shuffle=false
data.seed=1
data.dataloader_num_workers=0
data.filter_overlong_prompts=false
data.truncation=error
actor_rollout_ref.model.path=$W/tiny
+actor_rollout_ref.model.override_config.attn_implementation=sdpa
actor_rollout_ref.model.use_remove_padding=false
actor_rollout_ref.actor.optim.lr=1e-3
actor_rollout_ref.actor.ppo_mini_batch_size=$BATCH
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
actor_rollout_ref.actor.use_kl_loss=false
actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.tensor_model_parallel_size=1
actor_rollout_ref.rollout.gpu_memory_utilization=0.3
actor_rollout_ref.rollout.n=$N
actor_rollout_ref.rollout.enforce_eager=true
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
actor_rollout_ref.rollout.agent.num_workers=2
actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn
actor_rollout_ref.rollout.agent.agent_loop_config_path=$W/plug/agent_loops.yaml
reward.custom_reward_function.path=$W/plug/verl_grpo_reward.py
reward.custom_reward_function.name=compute_score
reward.num_workers=1
trainer.logger=['console','file']
trainer.project_name=shim_verl091
trainer.experiment_name=$name
trainer.n_gpus_per_node=1
trainer.nnodes=1
trainer.total_training_steps=$STEPS
trainer.val_before_train=false
trainer.test_freq=-1
trainer.save_freq=-1
trainer.rollout_data_dir=$W/$name/rollouts
ray_kwargs.ray_init.num_cpus=12
EOT
  [ "$DET" = 1 ] && echo "actor_rollout_ref.actor.fsdp_config.full_determinism=true"
  return 0
}

if [ $COMPOSE = 1 ]; then
  overrides plain > "$OUT/overrides.txt"
  python3 - "$OUT/overrides.txt" <<'PY'
import sys, os, importlib.util
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
cfgdir = os.path.join(os.path.dirname(importlib.util.find_spec("verl").origin), "trainer", "config")
ov = [l.strip() for l in open(sys.argv[1]) if l.strip()]
with initialize_config_dir(config_dir=cfgdir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=ov)
r = cfg.actor_rollout_ref.rollout
print("compose OK:", len(ov), "overrides; rollout free_cache_engine", r.free_cache_engine, "load_format", r.load_format,
      "calculate_log_probs", r.calculate_log_probs, "mode", r.mode, "use_v1", cfg.trainer.use_v1,
      "enable_sleep_mode" , r.get("enable_sleep_mode", "(dataclass default)"))
PY
  exit $?
fi

log() { echo "[verl_grpo $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/verl_grpo.log"; }

env_setup() {
  source "$VK/kit/env.sh"
  unset VLLM_ENABLE_V1_MULTIPROCESSING          # env.sh sets 0 for TRL; verl's AsyncLLM runs the engine core in its own process
  export PYTHONPATH=$VT:$W/plug:$PYTHONPATH      # verl, ray, transformers 5.9.0, tokenizers 0.22.2 BEFORE the bundle and the machine's site
  export RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 HYDRA_FULL_ERROR=1 VERL_LOGGING_LEVEL=INFO
}

for ph in $PHASES; do case $ph in
unpack)
  log "unpack"
  mkdir -p "$VK" /tmp/vkp /tmp/vtp
  if [ -f "$VK/site/vllm/__init__.py" ]; then log "bundle already in $VK (an earlier call of this warm machine)"; else
  (cd /tmp/vkp && cat bundle.tar.xz.part-* > bundle.tar.xz && sha256sum -c --quiet SHA256SUMS && tar -xJf bundle.tar.xz -C "$VK" && rm -f bundle.tar.xz*) || { log "UNPACK bundle FAILED"; ls -la /tmp/vkp | tee -a "$OUT/verl_grpo.log"; exit 1; }
  fi
  (cd /tmp/vtp && cat vt.tar.xz.part-* > vt.tar.xz && sha256sum -c --quiet VT_SHA256SUMS && tar -xJf vt.tar.xz -C "$(dirname "$VT")" && rm -f vt.tar.xz*) || { log "UNPACK vt FAILED"; ls -la /tmp/vtp | tee -a "$OUT/verl_grpo.log"; exit 1; }
  log "unpacked: $(du -sh "$VK" "$VT" | tr '\n' ' ')"
  ;;
check)
  env_setup
  log "check: imports, data, model"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee -a "$OUT/verl_grpo.log"
  python3 - <<'PY' 2>&1 | tail -40 | tee -a "$OUT/verl_grpo.log"
import importlib, time
t = time.time()
for m in ["ray", "transformers", "tokenizers", "tensordict", "transfer_queue", "vllm", "verl",
          "verl.trainer.main_ppo", "verl.trainer.ppo.v1.trainer_sync", "verl.workers.engine_workers",
          "verl.workers.rollout.vllm_rollout.vllm_async_server", "verl.experimental.agent_loop",
          "verl.experimental.reward_loop", "verl_grpo_plugin"]:
    try:
        mod = importlib.import_module(m); print("ok  ", m, getattr(mod, "__version__", ""), (getattr(mod, "__file__", "") or "")[:60])
    except Exception as e:
        import traceback; print("FAIL", m, type(e).__name__, e); traceback.print_exc(limit=-3)
print(f"imports {time.time()-t:.1f}s")
PY
  (cd "$REPO" && python3 tests/gpu/verl_grpo_data.py "$W") 2>&1 | tail -5 | tee -a "$OUT/verl_grpo.log"
  ;;
plain|shim|drop|dropstrict)
  env_setup
  name=$ph$TAG; run=$W/$name; mkdir -p "$run"; rm -rf "$run"/*
  mapfile -t OV < <(overrides "$name")
  export VERL_FILE_LOGGER_PATH=$OUT/verl091_${name}_metrics.jsonl
  unset SHIM_STRICT SHIM_TEST_DROP
  if [ "$ph" = drop ] || [ "$ph" = dropstrict ]; then
    mkdir -p "$W/drop" && cp "$REPO/tests/gpu/verl_drop_sitecustomize.py" "$W/drop/sitecustomize.py"
    export PYTHONPATH=$W/drop:$PYTHONPATH SHIM_TEST_DROP=${DROP:-layers.1.mlp.down_proj}
    [ "$ph" = dropstrict ] && export SHIM_STRICT=1
  fi
  if [ "$ph" != plain ]; then
    export SHIM_TRACE=$OUT/verl091_${name}_trace.jsonl SHIM_VERIFY_WEIGHTS=1
    launch=(python3 -m shim env -C "$run" python3 -m verl.trainer.main_ppo)
  else
    unset SHIM_TRACE SHIM_VERIFY_WEIGHTS
    launch=(env -C "$run" python3 -m verl.trainer.main_ppo)
  fi
  log "run $name: ${launch[*]} (${#OV[@]} overrides)"
  t0=$(date +%s)
  left=$(( START + BUDGET - $(date +%s) - 30 )); lim=${RUN_TIMEOUT:-420}; [ $left -lt $lim ] && lim=$left
  if [ $lim -lt 120 ]; then log "run $name SKIPPED: only ${left}s left in this call"; continue; fi
  log "run $name: limit ${lim}s"
  (cd "$REPO" && timeout -k 10 $lim "${launch[@]}" "${OV[@]}") > "$run/stdout.log" 2>&1
  rc=$?
  log "run $name rc=$rc in $(( $(date +%s) - t0 )) s"
  python3 -c "import sys; from ray.scripts.scripts import main; sys.argv=['ray','stop','--force']; main()" >> "$OUT/verl_grpo.log" 2>&1
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed 's/^/  GPU used after run: /' | tee -a "$OUT/verl_grpo.log"
  grep -a -n -E "Traceback|Error|error:|\[shim\]|sleep|wake|rollout_probs_diff|critic/score/mean|step:" "$run/stdout.log" | grep -v -E "^\s*$" | tail -400 > "$OUT/verl091_${name}_grep.txt"
  tail -c 200000 "$run/stdout.log" > "$OUT/verl091_${name}_stdout_tail.log"
  [ -d /tmp/ray/session_latest/logs ] && (cd /tmp/ray/session_latest && find logs -type f \( -name '*.err' -o -name '*.out' -o -name '*.log' \) -size -3M -print0 | tar -czf "$OUT/verl091_${name}_raylogs.tgz" --null -T -) 2>/dev/null
  mv /tmp/ray/session_latest "/tmp/ray/done_$name" 2>/dev/null; rm -f /tmp/ray/ray_current_cluster
  [ -d "$run/rollouts" ] && tar -czf "$OUT/verl091_${name}_rollouts.tgz" -C "$run" rollouts
  grep -a -c "stale weights" "$run/stdout.log" | sed "s/^/  'stale weights' lines in $name: /" | tee -a "$OUT/verl_grpo.log"
  grep -a -c "StaleWeights" "$run/stdout.log" | sed "s/^/  'StaleWeights' lines in $name: /" | tee -a "$OUT/verl_grpo.log"
  grep -a -c "returned no digests" "$run/stdout.log" | sed "s/^/  'returned no digests' lines in $name: /" | tee -a "$OUT/verl_grpo.log"
  if [ "$ph" != plain ] && [ -f "$SHIM_TRACE" ]; then
    (cd "$REPO" && python3 -m shim report "$SHIM_TRACE") > "$OUT/verl091_${name}_report.txt" 2>&1
  fi
  ;;
esac; done
log "done"
