#!/usr/bin/env bash
# ms-swift #6636's command (GRPO, vLLM colocated, sleep level 1, offload), run with the shim.
#
# On 8 Ascend NPUs with ms-swift 3.10.0 and PYTORCH_NPU_ALLOC_CONF=expandable_segments:True every
# rank's first sleep freed 0.00 GiB ("Sleep mode freed 0.00 GiB memory, 23.66 GiB memory is still in
# use", in under a millisecond): the engine's memory never went into vLLM's sleep pool. Prefixed with
# `vllm-sleep-shim`, the shim is active in the swift launcher, the torchrun agent and every rank: the
# engine is built with expandable segments off (your setting comes back for training), each sleep is
# verified (the GiB actually freed: the first sleep at INFO, every sleep in SHIM_TRACE and the
# summary; a WARNING when a sleep frees less than half of what the pool tracks), and after a level-2
# sleep the trained weights are pushed before every rollout. SHIM_TRACE collects every rank's
# sleep/wake events; `vllm-sleep-shim report` sums them.
#
# Works the same on CUDA GPUs (set PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF instead). Adjust
# MODEL, DATASET and the parallel sizes to your machine.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
DATASET=${DATASET:-AI-MO/NuminaMath-TIR#1000}
export NPROC_PER_NODE=${NPROC_PER_NODE:-8}
export PYTORCH_NPU_ALLOC_CONF=${PYTORCH_NPU_ALLOC_CONF:-expandable_segments:True}
export SHIM_TRACE=${SHIM_TRACE:-shim_trace.jsonl}

vllm-sleep-shim swift rlhf \
    --rlhf_type grpo \
    --model "$MODEL" \
    --dataset "$DATASET" \
    --reward_funcs accuracy format \
    --use_vllm true \
    --vllm_mode colocate \
    --vllm_tensor_parallel_size "$NPROC_PER_NODE" \
    --vllm_gpu_memory_utilization 0.5 \
    --sleep_level 1 \
    --offload_optimizer true \
    --offload_model true \
    --num_generations 8 \
    --per_device_train_batch_size 2 \
    --max_completion_length 1024 \
    --output_dir output/grpo_shim

vllm-sleep-shim report "$SHIM_TRACE"
