"""Every patch of the shim, in the order they are registered.

Importing this package imports only the patch modules, which import nothing of
torch, vLLM, TRL or ms-swift at module level.
"""
from patches import (
    swift_expandable_segments,
    swift_gkd_teacher_zero3,
    swift_level2_resync,
    trl_gold,
    trl_level2_resync,
    trl_online_dpo,
    trl_stale_weights,
    vllm_sleep_guard,
)

ALL = [
    trl_stale_weights.PATCH,
    trl_level2_resync.GRPO,
    trl_level2_resync.RLOO,
    trl_online_dpo.PATCH,
    trl_gold.PATCH,
    swift_level2_resync.PATCH,
    swift_expandable_segments.V3,
    swift_expandable_segments.V4,
    swift_expandable_segments.V4_MEGATRON,
    swift_expandable_segments.V4_RAY,
    *swift_gkd_teacher_zero3.PATCHES,
    vllm_sleep_guard.GUARD,
    vllm_sleep_guard.CHECK,
    vllm_sleep_guard.LLM_CHECK,
]
