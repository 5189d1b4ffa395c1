#!/usr/bin/env bash
# On-policy GKD from ms-swift issue #6639, with the shim in front.
#
# Student Qwen3-VL-8B under --deepspeed zero2, teacher Qwen3-VL-235B-A22B under
# --teacher_deepspeed zero3, rollouts from a vLLM server (server mode), 8 GPUs of 80 GB.
# Without the shim, ms-swift >= 3.10.1 loads the 235B teacher WHOLE onto every rank
# (transformers' global DeepSpeed config is the student's ZeRO-2) and dies at ~31% of
# the checkpoint. With `vllm-sleep-shim` in front:
#   - before any teacher weight is read, a preflight computes from the teacher's
#     config.json the bytes each rank will hold (~236e9 params x 2 bytes = 471 GB,
#     / 8 ranks = 59 GB) and checks them against the GPU's free memory; if they do not
#     fit, ONE error names the numbers and the fixes, in seconds instead of 30+ minutes;
#   - the teacher loads under a temporary ZeRO-3 config built from --teacher_deepspeed
#     (zero.Init: partitioned as it loads, no per-rank device_map); the student's ZeRO-2
#     config is restored right after.
# Check it is on: the log shows
#   [shim] INFO swift-gkd-teacher-zero3 (modelscope/ms-swift#6639, ms-swift 3.10.1): applied
#   [shim] INFO swift-gkd-teacher-zero3: teacher loads partitioned under its ZeRO-3 config (student zero2); ...
# (ms-swift 4.x: the id is swift-gkd-teacher-zero3-4x). Turn it off with
# SHIM_DISABLED_PATCHES=swift-gkd-teacher-zero3,swift-gkd-teacher-zero3-4x.
# Other ways out of #6639: --deepspeed zero3 / zero3_offload for the student, or (4.x)
# --teacher_model_server URL to serve the teacher outside the training ranks.
set -euo pipefail

# 1) The rollout server (its own GPUs or node; the student's weights are pushed to it).
#    CUDA_VISIBLE_DEVICES=0 swift rollout --model Qwen/Qwen3-VL-8B-Instruct --vllm_max_model_len 8192 &
VLLM_HOST=${VLLM_HOST:-127.0.0.1}
VLLM_PORT=${VLLM_PORT:-8000}

# 2) Training: 8 ranks. `vllm-sleep-shim` reaches the `swift` launcher, torchrun and every rank
#    (PYTHONPATH sitecustomize; it chains to your own sitecustomize if you have one).
NPROC_PER_NODE=${NPROC_PER_NODE:-8} \
vllm-sleep-shim swift rlhf \
    --rlhf_type gkd \
    --model Qwen/Qwen3-VL-8B-Instruct \
    --teacher_model Qwen/Qwen3-VL-235B-A22B-Instruct \
    --deepspeed zero2 \
    --teacher_deepspeed zero3 \
    --use_vllm true \
    --vllm_mode server \
    --vllm_server_host "$VLLM_HOST" \
    --vllm_server_port "$VLLM_PORT" \
    --train_type full \
    --torch_dtype bfloat16 \
    --dataset "${DATASET:-AI-ModelScope/LaTeX_OCR#2000}" \
    --lmbda 1 \
    --beta 0.5 \
    --max_length 4096 \
    --max_completion_length 1024 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 4 \
    --learning_rate 1e-5 \
    --num_train_epochs 1 \
    --save_steps 200 \
    --logging_steps 5 \
    --output_dir output/gkd-qwen3-vl-8b-from-235b
