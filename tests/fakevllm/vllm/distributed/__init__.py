"""Mirrors vllm/distributed/__init__.py (names importable; single-rank stand-ins)."""
from vllm.distributed.parallel_state import (  # noqa: F401
    destroy_distributed_environment,
    destroy_model_parallel,
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    get_world_group,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
)


def tensor_model_parallel_all_gather(x, dim=-1):
    return x


def tensor_model_parallel_all_reduce(x):
    return x
