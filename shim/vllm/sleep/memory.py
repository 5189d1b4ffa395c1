"""Device memory probes behind one small interface (CUDA through ``torch.cuda``,
Ascend NPU through ``torch.npu`` from torch_npu).

The device is the one vLLM runs on: ``vllm.platforms.current_platform.device_type``
when vLLM is importable, else whichever of CUDA / NPU torch reports. With
neither, :func:`probe` returns None and the memory features stand down.

Device readings (``mem_get_info`` is device-wide: another process allocating at
that moment distorts it): :func:`read_settled` around an engine construction,
:func:`read_before_sleep` / :func:`after_sleep` around a sleep whose freed
bytes are measured on the device (``shim.vllm.sleep.sleep_check`` decides which sleeps).
"""
from __future__ import annotations

import gc
import sys


class Probe:
    """``mem_get_info()`` -> (free, total) bytes; ``synchronize()``; ``empty_cache()``;
    ``set_allocator_settings(str)`` (the live allocator setting, where the backend has it)."""

    def __init__(self, name: str, module):
        self.name = name
        self.module = module

    def mem_get_info(self) -> tuple:
        free, total = self.module.mem_get_info()
        return int(free), int(total)

    def synchronize(self) -> None:
        self.module.synchronize()

    def empty_cache(self) -> None:
        self.module.empty_cache()

    def torch_cap(self) -> "tuple | None":
        """``(cap, reserved)`` bytes where torch's caching allocator is capped for this process
        (``set_per_process_memory_fraction`` below 1), else None; never raises."""
        try:
            fraction = float(self.module.get_per_process_memory_fraction())
            if fraction >= 1.0:
                return None
            return int(fraction * self.mem_get_info()[1]), int(self.module.memory_reserved())
        except Exception:
            return None

    def set_allocator_settings(self, setting: str) -> bool:
        memory = getattr(self.module, "memory", None)
        setter = getattr(memory, "_set_allocator_settings", None)
        if setter is None:
            return False
        setter(setting)
        return True


def device_type() -> str | None:
    vllm_platforms = sys.modules.get("vllm.platforms")
    if vllm_platforms is not None:
        platform = getattr(vllm_platforms, "current_platform", None)
        kind = getattr(platform, "device_type", None)
        if kind in ("cuda", "npu"):
            return kind
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available():
            return "cuda"
        npu = getattr(torch, "npu", None)
        if npu is not None and npu.is_available():
            return "npu"
    except Exception:
        return None
    return None


def probe() -> Probe | None:
    kind = device_type()
    if kind is None:
        return None
    import torch

    module = getattr(torch, kind, None)
    return Probe(kind, module) if module is not None else None


def read_settled(p: Probe, full_gc: bool = False) -> tuple:
    """(free, total) after synchronize, gc and empty_cache (around an engine construction).

    The collection is of the young generations unless ``full_gc``: a full one
    costs ~0.1-0.5 s in a training process.
    """
    p.synchronize()
    gc.collect(2 if full_gc else 1)
    p.empty_cache()
    return p.mem_get_info()


def read_before_sleep(p: Probe) -> tuple:
    """(free, total) right before a sleep: synchronize, cached blocks given back, read.

    No gc: garbage that still holds device tensors is collected by the sleep
    itself (``CuMemAllocator.sleep`` ends with ``gc.collect()`` +
    ``empty_cache``) and then counts as freed by it, as it does in vLLM's own
    figure; a young-generation collection here would cost milliseconds per
    sleep for that sliver.
    """
    p.synchronize()
    p.empty_cache()
    return p.mem_get_info()


def after_sleep(p: Probe, read: bool = True) -> "tuple | None":
    """Right after a sleep; returns (free, total) when ``read``, else None.

    vLLM's ``CuMemAllocator.sleep`` ends with ``gc.collect()`` +
    ``torch.cuda.empty_cache()``: on CUDA only the read is left. vllm-ascend's
    ``CaMemAllocator.sleep`` does neither (vllm-ascend#9563: device memory grows
    every cycle): on NPU the young garbage is collected and the cached blocks
    given back here, whether or not the device is read.
    """
    if p.name != "cuda":
        p.synchronize()
        gc.collect(1)
        p.empty_cache()
    elif read:
        p.synchronize()
    return p.mem_get_info() if read else None


def release_cached(p: "Probe | None" = None) -> None:
    """Before a wake: collect the young garbage, then give the allocator's cached blocks back
    (on the device of ``p``, the caller's probe, else :func:`probe`).

    vLLM >= 0.30 does this itself with a full ``gc.collect()`` (its callers skip this). A
    full collection costs 0.1-0.5 s in a training process of a few 100k objects, on every
    wake; the garbage that holds device tensors at a wake is the last step's, which the
    young generations hold, and ``empty_cache`` is what frees the blocks. No synchronize
    first: ``empty_cache`` waits on the events of blocks still in use on other streams and
    frees through ``cudaFree``, which synchronizes the device itself.
    """
    gc.collect(1)
    p = p or probe()
    if p is not None:
        p.empty_cache()
