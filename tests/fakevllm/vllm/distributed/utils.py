"""Mirrors vllm/distributed/utils.py StatelessProcessGroup (importable; the fake
only supports world_size 1 -- server mode weight sync is not simulated)."""


class StatelessProcessGroup:
    def __init__(self, rank: int = 0, world_size: int = 1, store=None, **kw):
        self.rank = rank
        self.world_size = world_size
        self.store = store

    @staticmethod
    def create(host: str, port: int, rank: int, world_size: int, **kw) -> "StatelessProcessGroup":
        return StatelessProcessGroup(rank, world_size)

    def barrier(self, *a, **k):
        return None

    def broadcast_obj(self, obj, src):
        return obj


def get_distributed_init_method(ip: str, port: int) -> str:
    return f"tcp://{ip}:{port}"
