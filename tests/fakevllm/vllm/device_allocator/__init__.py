"""Mirrors vllm/device_allocator/__init__.py (AllocationData, HandleType; from 0.34 ``discardable_allocations``).
From 0.28 ``AllocationData`` has ``is_asleep`` (set by ``CuMemAllocator.sleep``/``discard``, cleared by
``wake_up``); the stand-in reads it off the fake device's mapping of the allocation."""
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from vllm import _fake

HandleType = tuple[int, int, int, int]


@dataclass
class AllocationData:
    handle: HandleType
    tag: str
    cpu_backup_tensor: "torch.Tensor | object | None" = None

    if _fake.V >= _fake.Version("0.28.0"):
        @property
        def is_asleep(self) -> bool:
            from vllm._fake.device import DEVICE

            a = DEVICE.allocations.get(self.handle[2])
            return a is not None and not a.mapped


def discardable_allocations(pointer_to_data: Mapping, tensors: Collection[int]) -> set:
    """0.34 ``discardable_allocations``: the "weights" allocations every live tensor of which starts at one of
    ``tensors`` (the storage addresses of the parameters a level-2 sleep may discard). Upstream walks the
    weights pools' ``snapshot()`` blocks; the stand-in has no MemPool, so it reads the allocator's
    ``pointer_to_data`` and what each fake allocation holds (its payload's ``storage_ptrs``). An allocation
    whose contents the stand-in does not know is kept."""
    from vllm._fake.device import DEVICE

    if not tensors:
        return set()
    tensors = set(tensors)
    out = set()
    for ptr, data in pointer_to_data.items():
        if data.tag != "weights":
            continue
        a = DEVICE.allocations.get(ptr)
        held = getattr(getattr(a, "payload", None), "storage_ptrs", None)
        if held is not None and held() <= tensors:
            out.add(ptr)
    return out


if _fake.V < _fake.Version("0.34.0"):
    del discardable_allocations
