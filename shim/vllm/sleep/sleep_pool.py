"""The sleep pool's own bookkeeping: what vLLM's sleep allocator tracks, per tag.

vLLM allocates a sleep-mode engine's weights and KV cache inside ``CuMemAllocator.use_memory_pool(tag)``
(``vllm/device_allocator/cumem.py``; vllm-ascend: ``CaMemAllocator`` in
``vllm_ascend/device_allocator/camem.py``, the same design). The singleton ``<Allocator>.instance`` keeps one
``AllocationData`` per allocation in ``pointer_to_data`` (``handle[1]`` = its bytes, ``tag`` = "weights" /
"kv_cache"); ``get_current_usage()`` is their sum. Sleeping unmaps and releases every handle
(``unmap_and_release``) but keeps the records, so the sum stays the bytes the pool holds AWAKE: the bytes a
sleep can give back.

Nothing here creates the singleton or imports vLLM: a module that is not imported yet means there is no pool.
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


def tracked_bytes(probe, exact: bool = False, tags=None) -> int:
    """Bytes the pool tracks: the sum of its records' sizes (what ``get_current_usage()`` sums,
    kept between calls, see :func:`bytes_by_tag`), else ``get_current_usage()``; 0 without a pool.
    ``tags``: only the records of those of the deferrable tags ("weights", "kv_cache"), every other
    tag counted (vLLM >= 0.34's "runtime", "cudagraph", ... sleep with the weights)."""
    by_tag = bytes_by_tag(probe, exact)
    if by_tag:
        if tags is not None:
            return sum(n for tag, n in by_tag.items() if tag in tags or tag not in ("weights", "kv_cache"))
        return sum(by_tag.values())
    alloc = allocator(probe.name) if probe is not None else None
    if alloc is None:
        return 0
    try:
        return int(alloc.get_current_usage())
    except Exception:
        return 0


_cache: list = [None, None, {}]  # [allocator, signature, {tag: bytes}]


def bytes_by_tag(probe, exact: bool = False) -> dict:
    """``{tag: bytes}`` of the pool's allocations (``pointer_to_data``); {} without a pool
    or where the records are not shaped as in vLLM.

    Summing the records is a Python loop over every allocation (a few hundred for a 1 B
    model: tens of microseconds, on every sleep and wake). The pool's records change only
    when the engine allocates or frees inside ``use_memory_pool`` (construction, a KV-cache
    rebuild); sleep and wake keep them (``unmap_and_release`` / ``create_and_map`` reuse
    each record's handle). So the sums are kept and recomputed when the records' count or
    their newest key changes, or when ``exact`` (the sleeps measured on the device, whose
    verdict is exact). A record replaced in place by one of another size at the same
    address, as the newest record, would go unseen until the next ``exact`` sum.
    """
    alloc = allocator(probe.name) if probe is not None else None
    records = getattr(alloc, "pointer_to_data", None)
    if not isinstance(records, dict):
        return {}
    try:
        signature = (len(records), next(reversed(records), None))
        if not exact and _cache[0] is alloc and _cache[1] == signature:
            return dict(_cache[2])
        out: dict = {}
        for data in list(records.values()):
            out[data.tag] = out.get(data.tag, 0) + int(data.handle[1])
    except Exception:
        return {}
    _cache[:] = [alloc, signature, out]
    return dict(out)



def spans(tag: str) -> list:
    """``[(start, end)]`` address ranges of the pool's allocations with ``tag`` (every sleep allocator
    that exists in this process; ``pointer_to_data`` is keyed by each allocation's device address)."""
    out = []
    for device in _ALLOCATORS:
        records = getattr(allocator(device), "pointer_to_data", None)
        if not isinstance(records, dict):
            continue
        try:
            for ptr, data in list(records.items()):
                if data.tag == tag:
                    out.append((int(ptr), int(ptr) + int(data.handle[1])))
        except Exception:  # records not shaped as in vLLM: no span known
            continue
    return out
