"""Mirrors vllm/v1/worker/extensible_kv_cache.py (0.34): the KV cache in driver-mapped memory OUTSIDE
the sleep pool (``ExtensibleKVCache``: ``release_physical`` drops the pages and keeps the addresses,
``recommit`` maps fresh zeroed pages, ``physical_bytes``), and the cap it puts on torch's caching
allocator for the whole process (``set_torch_memory_limit`` ->
``torch.cuda.set_per_process_memory_fraction``): after warm-up ``measure_kv_cache_blocks`` sets it
at "torch reserved now + what stays free beside the KV cache"; only ``kv_cache_lent_for_weight_update``
(vLLM's own reload) and ``free`` lift it, never a sleep.

The stand-in commits the whole cache at once (upstream extends it block by block up to the measured
size); its sizing is the worker's ``determine_available_memory``, and the non-torch reserve is
``NON_TORCH_RESERVE_BYTES``.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from vllm import _fake
from vllm._fake.device import DEVICE

if _fake.V < _fake.Version("0.34.0"):
    raise ModuleNotFoundError(f"No module named 'vllm.v1.worker.extensible_kv_cache' (vLLM {_fake.VERSION})",
                              name="vllm.v1.worker.extensible_kv_cache")

NON_TORCH_RESERVE_BYTES = 256 << 20  # upstream KV_CACHE_NON_TORCH_RESERVE_BYTES (order of magnitude)


class ExtensibleKVCache:
    def __init__(self, nbytes: int):
        self.alloc = DEVICE.allocate(nbytes, label="kv_cache", torch_owned=False)  # cuMemMap, not torch
        self.num_committed_blocks = 1
        self.torch_memory_limit: "int | None" = None

    @property
    def physical_bytes(self) -> int:
        return self.alloc.nbytes if self.alloc.mapped else 0

    def physical_bytes_for(self, num_blocks: int) -> int:
        """Bytes a commit of ``num_blocks`` maps (the stand-in's one block is the whole cache)."""
        return self.alloc.nbytes * num_blocks

    def release_physical(self) -> None:
        """Drop physical pages for sleep; addresses and views stay valid."""
        DEVICE.unmap(self.alloc)
        _fake.log_event("extensible_kv_release", nbytes=self.alloc.nbytes)

    def recommit(self) -> None:
        """Map fresh zeroed pages for the blocks committed before release."""
        if not self.alloc.mapped:
            DEVICE.map(self.alloc)
        _fake.log_event("extensible_kv_recommit", nbytes=self.alloc.nbytes)

    def set_torch_memory_limit(self, num_bytes: "int | None") -> None:
        """Cap what torch's caching allocator reserves on this device, or lift the cap (None)."""
        self.torch_memory_limit = num_bytes
        total = DEVICE.total
        fraction = 1.0 if num_bytes is None else min(num_bytes / total, 1.0)
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
        _fake.log_event("torch_memory_limit", limit=num_bytes, fraction=fraction)

    def free(self) -> None:
        if self.torch_memory_limit is not None:
            self.set_torch_memory_limit(None)
        DEVICE.free(self.alloc)


def measure_kv_cache_blocks(kv_cache: ExtensibleKVCache) -> None:
    """After warm-up: the torch cap at reserved + what stays free beside the KV cache (less the reserve
    for allocations outside torch)."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    kv_cache.set_torch_memory_limit(torch.cuda.memory_reserved() + max(free - NON_TORCH_RESERVE_BYTES, 0))


@contextmanager
def kv_cache_lent_for_weight_update(kv_cache, model=None, *, reclaimable: bool = False, fail_if_short: bool = False):
    """vLLM's own reload: torch's cap lifted for the update and put back after it (the stand-in never
    needs to lend the cache's pages: its updates fit)."""
    limit = None if kv_cache is None else kv_cache.torch_memory_limit
    if limit is not None:
        kv_cache.set_torch_memory_limit(None)
    try:
        yield
    finally:
        if limit is not None:
            kv_cache.set_torch_memory_limit(limit)
