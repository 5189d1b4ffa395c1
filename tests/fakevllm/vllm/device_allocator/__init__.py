"""Mirrors vllm/device_allocator/__init__.py (AllocationData, HandleType)."""
from dataclasses import dataclass

import torch

HandleType = tuple[int, int, int, int]


@dataclass
class AllocationData:
    handle: HandleType
    tag: str
    cpu_backup_tensor: "torch.Tensor | object | None" = None
