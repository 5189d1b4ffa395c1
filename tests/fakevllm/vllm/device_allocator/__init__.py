"""Mirrors vllm/device_allocator/__init__.py (AllocationData, HandleType). From 0.28 ``AllocationData``
has ``is_asleep`` (set by ``CuMemAllocator.sleep``/``discard``, cleared by ``wake_up``); the stand-in
reads it off the fake device's mapping of the allocation."""
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
