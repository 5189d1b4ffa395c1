"""Every patch of the shim, in the order they are registered.

Importing this package imports only the patch modules, which import nothing of
torch, vLLM, TRL or ms-swift at module level.
"""
from patches import trl_gold, trl_level2_resync, trl_online_dpo, trl_stale_weights

ALL = [
    trl_stale_weights.PATCH,
    trl_level2_resync.GRPO,
    trl_level2_resync.RLOO,
    trl_online_dpo.PATCH,
    trl_gold.PATCH,
]
