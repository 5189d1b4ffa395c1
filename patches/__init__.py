"""The shim's patches, installed as ``shim.patches`` (the repository keeps them in ``patches/``).

``INDEX`` is all that start-up reads: one row per patch, in registration order:
(patch id, module of this package that defines it, the upstream module its hook waits for).
A patch module is imported only when its upstream module is imported (or by ``status``);
importing this package imports nothing at all. The contract test
(``tests/patches``) checks every row against the ``PATCHES`` list its module exports.

``REMOVED``: ids of patches deleted on schedule (id -> when and why). They stay known so
that a ``SHIM_DISABLED_PATCHES`` naming one keeps working silently after an upgrade.
"""

INDEX = (
    ("trl-stale-weights", "trl_stale_weights", "trl.generation.vllm_generation"),
    ("trl-grpo-level2-resync", "trl_level2_resync", "trl.trainer.grpo_trainer"),
    ("trl-rloo-level2-resync", "trl_level2_resync", "trl.trainer.rloo_trainer"),
    ("trl-online-dpo-resync", "trl_online_dpo", "trl.experimental.online_dpo.online_dpo_trainer"),
    ("trl-gold-weights-asleep", "trl_gold", "trl.experimental.gold.gold_trainer"),
    ("trl-push-reprocess", "trl_push_reprocess", "trl.generation.vllm_generation"),
    ("trl-online-dpo-push-reprocess", "trl_push_reprocess", "trl.experimental.online_dpo.online_dpo_trainer"),
    ("trl-online-dpo-push-reprocess-0x", "trl_push_reprocess", "trl.trainer.online_dpo_trainer"),
    ("trl-grpo-push-reprocess", "trl_push_reprocess", "trl.trainer.grpo_trainer"),
    ("trl-rloo-push-reprocess", "trl_push_reprocess", "trl.trainer.rloo_trainer"),
    ("swift-resample-wake-order", "swift_resample_wake_order", "swift.rlhf_trainers.rollout_mixin"),
    ("swift-megatron-resample-wake-order", "swift_resample_wake_order", "swift.megatron.trainers.rollout_mixin"),
    # before swift-level2-resync / swift-grpo-level2-resync, whose wrappers of _fast_infer stay the outer ones on
    # 3.x (either order works: one acts at level 1 only, the other at level 2 only)
    ("swift-resample-wake-order-3x", "swift_resample_wake_order", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("swift-grpo-resample-wake-order", "swift_resample_wake_order", "swift.trainers.rlhf_trainer.grpo_trainer"),
    ("swift-level2-resync", "swift_level2_resync", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("swift-grpo-level2-resync", "swift_level2_resync", "swift.trainers.rlhf_trainer.grpo_trainer"),
    ("swift-level2-lora-adapter", "swift_level2_resync", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("swift-expandable-segments", "swift_expandable_segments", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("swift-expandable-segments-4x", "swift_expandable_segments", "swift.rlhf_trainers.rollout_mixin"),
    ("swift-expandable-segments-megatron", "swift_expandable_segments", "swift.megatron.trainers.rollout_mixin"),
    ("swift-expandable-segments-ray", "swift_expandable_segments", "swift.ray.megatron.rollout.ray_vllm_engine"),
    ("swift-gkd-teacher-zero3", "swift_gkd_teacher_zero3", "swift.llm.train.rlhf"),
    ("swift-gkd-teacher-zero3-4x", "swift_gkd_teacher_zero3", "swift.pipelines.train.rlhf"),
    ("swift-zero3-offload", "swift_zero3_offload", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("swift-grpo-zero3-offload", "swift_zero3_offload", "swift.trainers.rlhf_trainer.grpo_trainer"),
    ("swift-gkd-offload-reload", "swift_offload_reload", "swift.rlhf_trainers.gkd_trainer"),
    ("swift-grpo-offload-reload", "swift_offload_reload", "swift.rlhf_trainers.grpo_trainer"),
    ("vllm-sleep-guard", "vllm_sleep_guard", "vllm.v1.engine.llm_engine"),
    ("vllm-sleep-check", "vllm_sleep_guard", "vllm.v1.engine.llm_engine"),
    ("vllm-llm-sleep-check", "vllm_sleep_guard", "vllm.entrypoints.llm"),
    # the torch cap's wrappers innermost: the cap is off before the worker's check judges the sleep
    ("vllm-torch-cap-sleep", "vllm_torch_cap", "vllm.v1.worker.gpu_worker"),
    # the worker's guard before its check (the check's wrapper outside, as on LLMEngine)
    ("vllm-worker-sleep-guard", "vllm_sleep_guard", "vllm.v1.worker.gpu_worker"),
    ("vllm-worker-sleep-check", "vllm_sleep_guard", "vllm.v1.worker.gpu_worker"),
    ("vllm-ascend-worker-sleep-guard", "vllm_sleep_guard", "vllm_ascend.worker.worker"),
    ("vllm-ascend-worker-sleep-check", "vllm_sleep_guard", "vllm_ascend.worker.worker"),
    ("vllm-core-wake-plan", "vllm_sleep_guard", "vllm.v1.engine.core"),
    ("trl-vlm-encoder-cache", "trl_vlm_encoder_cache", "trl.generation.vllm_generation"),
    ("trl-online-dpo-encoder-cache", "trl_vlm_encoder_cache", "trl.experimental.online_dpo.online_dpo_trainer"),
    ("trl-online-dpo-encoder-cache-0x", "trl_vlm_encoder_cache", "trl.trainer.online_dpo_trainer"),
    ("trl-lora-merge-drift", "trl_lora_merge_drift", "trl.generation.vllm_generation"),
    ("trl-lora-merge-drift-sync", "trl_lora_merge_drift", "trl.generation.vllm_generation"),
    ("trl-lora-merge-drift-grpo", "trl_lora_merge_drift", "trl.trainer.grpo_trainer"),
    ("trl-lora-merge-drift-rloo", "trl_lora_merge_drift", "trl.trainer.rloo_trainer"),
    ("swift-lora-merge-drift", "swift_lora_merge_drift", "swift.rlhf_trainers.rollout_mixin"),
    ("swift-lora-merge-drift-3x", "swift_lora_merge_drift", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("trl-sleep-level", "trl_sleep_level", "trl.generation.vllm_generation"),
    ("vllm-prefix-reset-check", "vllm_prefix_reset_check", "vllm.v1.engine.llm_engine"),
    ("vllm-level2-buffers", "vllm_level2_buffers", "vllm.v1.worker.gpu_worker"),
    ("vllm-ascend-level2-buffers", "vllm_level2_buffers", "vllm_ascend.worker.worker"),
    ("vllm-ascend-moe-wake-layout", "vllm_ascend_moe_wake", "vllm_ascend.worker.worker"),
    ("vllm-level2-tensors", "vllm_level2_buffers", "vllm.v1.worker.gpu_worker"),
    ("vllm-ascend-level2-tensors", "vllm_level2_buffers", "vllm_ascend.worker.worker"),
    ("vllm-level2-drafter", "vllm_level2_drafter", "vllm.engine.arg_utils"),
    ("verify-weights-vllm", "verify_weights", "vllm.entrypoints.llm"),
    ("verify-weights-trl", "verify_weights", "trl.generation.vllm_generation"),
    ("verify-weights-trl-grpo", "verify_weights", "trl.trainer.grpo_trainer"),
    ("verify-weights-trl-rloo", "verify_weights", "trl.trainer.rloo_trainer"),
    ("verify-weights-trl-online-dpo", "verify_weights", "trl.experimental.online_dpo.online_dpo_trainer"),
    ("verify-weights-trl-gold", "verify_weights", "trl.experimental.gold.gold_trainer"),
    ("verify-weights-swift", "verify_weights", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("verify-weights-swift-4x", "verify_weights", "swift.rlhf_trainers.rollout_mixin"),
    ("verify-weights-verl", "verify_weights", "verl.workers.rollout.vllm_rollout.vllm_rollout"),
    ("verify-weights-verl-server", "verify_weights", "verl.workers.rollout.vllm_rollout.vllm_async_server"),
    ("verify-weights-vllm-worker", "verify_weights", "vllm.v1.worker.gpu_worker"),
    ("verl-mtp-sleep-level", "verl_mtp_sleep_level", "verl.workers.rollout.vllm_rollout.vllm_async_server"),
    ("verl-vlm-encoder-cache", "verl_vlm_encoder_cache", "verl.workers.rollout.vllm_rollout.vllm_async_server"),
    ("trainer-metrics", "trainer_metrics", "transformers.trainer"),
    ("trainer-metrics-swift", "trainer_metrics", "swift.trainers.rlhf_trainer.rollout_mixin"),
    ("trainer-metrics-swift-4x", "trainer_metrics", "swift.rlhf_trainers.rollout_mixin"),
)

REMOVED = {}
