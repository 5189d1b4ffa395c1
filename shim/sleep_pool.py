"""The sleep pool's own bookkeeping: what vLLM's sleep allocator tracks, per tag.

vLLM allocates a sleep-mode engine's weights and KV cache inside
``CuMemAllocator.use_memory_pool(tag)`` (``vllm/device_allocator/cumem.py``;
vllm-ascend: ``CaMemAllocator`` in ``vllm_ascend/device_allocator/camem.py``,
the same design). The singleton ``<Allocator>.instance`` keeps one
``AllocationData`` per allocation in ``pointer_to_data`` (``handle[1]`` = its
bytes, ``tag`` = "weights" / "kv_cache"); ``get_current_usage()`` is their sum.
Sleeping unmaps and releases every handle (``unmap_and_release``) but keeps the
records, so the sum stays the bytes the pool holds AWAKE: the bytes a sleep can
give back.

Nothing here creates the singleton or imports vLLM: a module that is not
imported yet means there is no pool.
"""
from __future__ import annotations

import sys

_ALLOCATORS = {
    "cuda": ("vllm.device_allocator.cumem", "CuMemAllocator"),
    "npu": ("vllm_ascend.device_allocator.camem", "CaMemAllocator"),
}


def allocator(device: str):
    """The sleep allocator singleton of ``device`` if it exists (never created here)."""
    mod_name, cls_name = _ALLOCATORS.get(device, (None, None))
    cls = getattr(sys.modules.get(mod_name or ""), cls_name or "", None)
    return vars(cls).get("instance") if isinstance(cls, type) else None


def tracked_bytes(probe) -> int:
    """Bytes the pool tracks (``get_current_usage()``); 0 without a pool."""
    alloc = allocator(probe.name) if probe is not None else None
    if alloc is None:
        return 0
    try:
        return int(alloc.get_current_usage())
    except Exception:
        return 0


def bytes_by_tag(probe) -> dict:
    """``{tag: bytes}`` of the pool's allocations (``pointer_to_data``); {} without a pool
    or where the records are not shaped as in vLLM."""
    alloc = allocator(probe.name) if probe is not None else None
    records = getattr(alloc, "pointer_to_data", None)
    if not isinstance(records, dict):
        return {}
    out: dict = {}
    try:
        for data in list(records.values()):
            out[data.tag] = out.get(data.tag, 0) + int(data.handle[1])
    except Exception:
        return {}
    return out
