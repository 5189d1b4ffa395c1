"""Mirrors vllm/distributed/parallel_state.py (GroupCoordinator, get_world_group,
get_tp_group ...) for a single in-process rank."""
import os


class GroupCoordinator:
    def __init__(self, name: str):
        self.unique_name = name
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.rank_in_group = 0
        self.world_size = 1
        self.ranks = [self.rank]
        self.cpu_group = None
        self.device_group = None
        self.device_communicator = None

    @property
    def is_first_rank(self):
        return True

    @property
    def is_last_rank(self):
        return True

    def barrier(self):
        return None

    def all_reduce(self, x):
        return x

    def all_gather(self, x, dim=-1):
        return x

    def broadcast(self, x, src=0):
        return x


_WORLD = GroupCoordinator("world")
_TP = GroupCoordinator("tp")
_PP = GroupCoordinator("pp")
_DP = GroupCoordinator("dp")
_EP = GroupCoordinator("ep")


def get_world_group():
    return _WORLD


def get_tp_group():
    return _TP


get_tensor_model_parallel_group = get_tp_group


def get_pp_group():
    return _PP


def get_dp_group():
    return _DP


def get_ep_group():
    return _EP


def get_tensor_model_parallel_rank():
    return 0


def get_tensor_model_parallel_world_size():
    return 1


def model_parallel_is_initialized():
    return True


def init_distributed_environment(*a, **k):
    return None


def initialize_model_parallel(*a, **k):
    return None


def ensure_model_parallel_initialized(*a, **k):
    return None


def destroy_model_parallel():
    return None


def destroy_distributed_environment():
    return None


def cleanup_dist_env_and_memory(shutdown_ray: bool = False):
    import gc
    gc.collect()
