"""Mirrors vllm/distributed/device_communicators/pynccl.py PyNcclCommunicator
(importable; collective calls raise: no fake interconnect)."""


class PyNcclCommunicator:
    def __init__(self, group, device=None, **kw):
        self.group = group
        self.device = device
        self.rank = getattr(group, "rank", 0)
        self.world_size = getattr(group, "world_size", 1)

    def _na(self, *a, **k):
        raise NotImplementedError("fakevllm: PyNcclCommunicator collectives are not simulated")

    broadcast = all_reduce = send = recv = _na
