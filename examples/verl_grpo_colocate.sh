#!/usr/bin/env bash
# verl 0.9.1 GRPO with the vLLM rollout colocated on the training GPUs (verl's hybrid engine), under the shim.
#
# Needs: NVIDIA GPU(s), verl 0.9.1 with vLLM (pip install "verl[vllm]==0.9.1"), this shim installed.
# Data: verl's GSM8K parquet files, made by verl's own script (it is in verl's repository, not in the wheel):
#   git clone -b v0.9.1 https://github.com/volcengine/verl && python3 verl/examples/data_preprocess/gsm8k.py \
#       --local_save_dir ~/data/gsm8k
#
# The sleep in this setup (verl's defaults, spelled out below): verl builds its vLLM engine with sleep mode on
# (RolloutConfig.enable_sleep_mode, default true) and, with free_cache_engine=true, puts it to sleep after
# every rollout so FSDP can train in that memory: level 2 for full weights (weights and KV cache dropped, the
# trained weights synced back at the next wake), level 1 with LoRA, MTP or on NPUs.
# What `vllm-sleep-shim` in front adds: the shim is active in the driver, every Ray actor the driver's
# ray.init() starts and the vLLM engine-core and worker processes; every sleep is measured (the GiB it
# freed: the first sleep and wake at INFO, the rest in SHIM_TRACE and a summary; a WARNING when a sleep frees
# less than half of what the sleep pool tracks);
# with SHIM_VERIFY_WEIGHTS=1 every weight update verl streams into vLLM is compared, tensor by tensor, with
# what the vLLM worker holds afterwards: a tensor that did not land is reported as "stale weights" naming
# it (add SHIM_STRICT=1 to stop the run there). verl 0.7.1-0.8.x: it also fixes volcengine/verl#6661 (MTP
# drafter lost in a level-2 sleep) and #6523 (stale image encoder cache); on 0.9.1 those stand down (fixed
# upstream). SHIM_TRACE collects every process's sleep/wake events; `vllm-sleep-shim report` sums them.
#
# A Ray cluster you start yourself (`ray start --head`) must be started under the shim too
# (`vllm-sleep-shim ray start --head ...` on every node), else the actors run without it.
#
# Knobs (environment): MODEL, DATA (folder with train.parquet / test.parquet), NGPUS (GPUs on this node),
# STEPS, SHIM_VERIFY_WEIGHTS (default 1), SHIM_TRACE (default verl_shim_trace.jsonl); DRY_RUN=1 prints the
# commands instead of running them. Extra arguments are passed to verl as more overrides, e.g.
#   bash examples/verl_grpo_colocate.sh trainer.logger='[console,wandb]'
# Check it is on: the log (the vLLMHttpServer actor's lines) shows `[shim] INFO vllm-worker-sleep-check (...):
# applied` and the first sleep with the GiB it freed; the report at the end has a row per sleep.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-$HOME/data/gsm8k}
NGPUS=${NGPUS:-1}
STEPS=${STEPS:-20}
export SHIM_VERIFY_WEIGHTS=${SHIM_VERIFY_WEIGHTS:-1}
export SHIM_TRACE=${SHIM_TRACE:-verl_shim_trace.jsonl}

OVERRIDES=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=false
    data.train_files="$DATA/train.parquet"
    data.val_files="$DATA/test.parquet"
    data.train_batch_size=64
    data.max_prompt_length=512
    data.max_response_length=512
    actor_rollout_ref.model.path="$MODEL"
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=32
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    actor_rollout_ref.actor.use_kl_loss=false
    # colocated rollout: vLLM shares the GPUs with FSDP and sleeps between rollouts
    actor_rollout_ref.hybrid_engine=true
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.free_cache_engine=true
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    trainer.logger='[console]'
    trainer.project_name=verl_shim
    trainer.experiment_name=grpo_colocate
    trainer.n_gpus_per_node="$NGPUS"
    trainer.nnodes=1
    trainer.total_training_steps="$STEPS"
    trainer.save_freq=-1
    trainer.test_freq=-1
    trainer.val_before_train=false
)

run() {  # DRY_RUN=1: print the command (shell-quoted), do not run it
    if [ "${DRY_RUN:-0}" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [ "${DRY_RUN:-0}" != 1 ] && [ ! -f "$DATA/train.parquet" ]; then
    echo "no $DATA/train.parquet: make it with verl's examples/data_preprocess/gsm8k.py --local_save_dir $DATA" \
         "(see the top of this file), or set DATA" >&2
    exit 2
fi
[ "${DRY_RUN:-0}" = 1 ] && echo "SHIM_VERIFY_WEIGHTS=$SHIM_VERIFY_WEIGHTS SHIM_TRACE=$SHIM_TRACE"
run vllm-sleep-shim python3 -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
run vllm-sleep-shim report "$SHIM_TRACE"
