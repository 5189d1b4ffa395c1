"""Mirrors vllm/device_allocator/cumem.py: CuMemAllocator (singleton
``get_instance``, ``use_memory_pool(tag)``, ``sleep(offload_tags)`` (0.34: ``sleep(offload_tags,
discardable)``, see ``_sleep_034``),
``wake_up(tags)``, ``get_current_usage``).

The C extension (cumem_allocator.cpp: my_malloc/my_free, create_and_map,
unmap_and_release) and the MemPool are replaced by the fake device
(vllm._fake.device).  The python logic is upstream's, including the
expandable-segments handling of ``use_memory_pool``, which depends on the
vLLM version (FAKEVLLM_VERSION):
- <= 0.20.0: ``__init__`` asserts PYTORCH_CUDA_ALLOC_CONF has no
  "expandable_segments:True";
- 0.20.1 - 0.32.x: ``use_memory_pool`` reads ONLY the PYTORCH_CUDA_ALLOC_CONF
  string, turns expandable segments off with
  ``torch.cuda.memory._set_allocator_settings("expandable_segments:False")`` and
  back on afterwards (PYTORCH_ALLOC_CONF or a live setting are not seen);
- >= 0.31: reads the live allocator config, else PYTORCH_ALLOC_CONF,
  PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF (``device_allocator/alloc_conf.py``),
  and rewrites the whole string with only expandable_segments flipped, so the
  user's other options survive.

From 0.28 (``cumem.py`` ``discard``; called by ``Worker.discard`` from 0.31): ``discard(tags)`` unmaps
the mapped allocations with those tags without a CPU copy (``EngineCore.release_kv_cache_memory`` ->
``Worker.discard``); from 0.28 ``wake_up`` maps only the allocations that are asleep
(``AllocationData.is_asleep``; here: the fake device's mapping), quietly.
"""
from __future__ import annotations

import gc
import os
from contextlib import contextmanager
from typing import Any

import torch

from vllm import _fake
from vllm._fake.device import DEVICE
from vllm.device_allocator import AllocationData, HandleType
from vllm.logger import init_logger

logger = init_logger(__name__)

cumem_available = _fake.DEVICE_TYPE == "cuda"


def _alloc_of(handle: HandleType):
    return DEVICE.allocations.get(handle[2])


def create_and_map(allocation_handle: HandleType) -> None:
    a = _alloc_of(allocation_handle)
    if a is not None:
        DEVICE.map(a)


def unmap_and_release(allocation_handle: HandleType) -> None:
    a = _alloc_of(allocation_handle)
    if a is not None:
        DEVICE.unmap(a)


def _expandable_enabled_for_pool() -> bool:
    """Which expandable-segments signal this vLLM version's use_memory_pool sees."""
    if _fake.V >= _fake.Version("0.31.0"):
        from vllm.device_allocator import alloc_conf
        return alloc_conf.conf_flag_enabled(alloc_conf.current_alloc_conf(), alloc_conf.EXPANDABLE_SEGMENTS)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return "expandable_segments:True" in conf


class CuMemAllocator:
    """Singleton that manages the sleep-mode memory pool (see module doc)."""

    instance: "CuMemAllocator | None" = None
    default_tag: str = "default"
    _platform_name = "cuda"

    @classmethod
    def get_instance(cls) -> "CuMemAllocator":
        assert cumem_available, "cumem allocator is not available"
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self):
        if _fake.V <= _fake.Version("0.20.0"):
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            assert "expandable_segments:True" not in conf, (
                "Expandable segments are not compatible with memory pool. "
                "Please track https://github.com/pytorch/pytorch/issues/147851 "
                "for the latest updates.")
        self.pointer_to_data: dict[int, AllocationData] = {}
        self.current_tag: str = CuMemAllocator.default_tag
        self.allocator_and_pools: dict[str, Any] = {}
        self.python_malloc_callback = self._python_malloc_callback
        self.python_free_callback = self._python_free_callback

    # -- callbacks from the (fake) pluggable allocator ------------------------
    def _python_malloc_callback(self, allocation_handle: HandleType) -> None:
        self.pointer_to_data[allocation_handle[2]] = AllocationData(allocation_handle, self.current_tag)

    def _python_free_callback(self, ptr: int) -> HandleType:
        data = self.pointer_to_data.pop(ptr)
        data.cpu_backup_tensor = None
        self._sync()
        return data.handle

    def _sync(self):
        torch.cuda.synchronize()

    def _empty_cache(self):
        torch.cuda.empty_cache()

    # -- sleep / wake ------------------------------------------------------------
    def _sleep_upto_033(self, offload_tags: tuple[str, ...] | str | None = None) -> None:
        self._sleep(offload_tags)

    def _sleep_034(self, offload_tags: tuple[str, ...] | str | None = None, discardable=()) -> None:
        """0.34 ``CuMemAllocator.sleep(offload_tags, discardable)``: an allocation of an offloaded tag is
        discarded instead when ``discardable_allocations`` finds it holds nothing but the tensors at
        ``discardable`` (the parameters a level-2 sleep lets go)."""
        from vllm.device_allocator import discardable_allocations

        self._sleep(offload_tags, discardable_allocations(self.pointer_to_data, discardable))

    sleep = _sleep_034 if _fake.V >= _fake.Version("0.34.0") else _sleep_upto_033

    def _sleep(self, offload_tags, discarded=frozenset()) -> None:
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        assert isinstance(offload_tags, tuple)
        total_bytes = 0
        backup_bytes = 0
        for ptr, data in self.pointer_to_data.items():
            handle = data.handle
            total_bytes += handle[1]
            a = _alloc_of(handle)
            if data.tag in offload_tags and ptr not in discarded:
                backup_bytes += handle[1]
                # cudaMemcpy device -> pinned CPU copy
                if a is not None and a.mapped and a.payload is not None:
                    data.cpu_backup_tensor = a.payload.backup()
                elif a is not None and a.payload is None:
                    data.cpu_backup_tensor = torch.empty(0, dtype=torch.uint8)
            unmap_and_release(handle)
        logger.info(
            "%s: sleep freed %.2f GiB memory in total, of which %.2f GiB is backed up in CPU and "
            "the rest %.2f GiB is discarded directly.", type(self).__name__,
            total_bytes / 1024**3, backup_bytes / 1024**3, (total_bytes - backup_bytes) / 1024**3)
        _fake.log_event("allocator_sleep", allocator=type(self).__name__, offload_tags=list(offload_tags),
                        pool_bytes=total_bytes, backup_bytes=backup_bytes, discarded=len(discarded))
        self._after_sleep()

    def _after_sleep(self) -> None:
        """vLLM's ``CuMemAllocator.sleep`` ends with ``gc.collect()`` + ``torch.cuda.empty_cache()``."""
        gc.collect()
        self._empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        successfully_mapped = []
        try:
            for ptr, data in self.pointer_to_data.items():
                if tags is None or data.tag in tags or (_fake.V >= _fake.Version("0.34.0")
                                                        and data.tag not in ("weights", "kv_cache")):
                    handle = data.handle
                    a = _alloc_of(handle)
                    if a is not None and a.mapped:
                        if _fake.V >= _fake.Version("0.28.0"):  # 0.28+ cumem.py wake_up: `if not data.is_asleep: continue`
                            continue
                        # Not verified against the C extension: re-mapping a mapped range.
                        # The fake leaves it mapped (contents kept) and records it.
                        _fake.log_event("allocator_double_map", tag=data.tag, nbytes=handle[1])
                        continue
                    create_and_map(handle)
                    successfully_mapped.append(ptr)
                    if data.cpu_backup_tensor is not None:
                        if a is not None and a.payload is not None:
                            a.payload.restore(data.cpu_backup_tensor)
                        data.cpu_backup_tensor = None
        except Exception as e:
            logger.error("Failed to wake up allocator: %s. Rolling back %d successfully mapped "
                         "allocations.", str(e), len(successfully_mapped))
            for ptr in successfully_mapped:
                unmap_and_release(self.pointer_to_data[ptr].handle)
            raise
        _fake.log_event("allocator_wake_up", allocator=type(self).__name__, tags=tags)

    def discard(self, tags: tuple[str, ...] | str) -> None:
        """0.28+ ``CuMemAllocator.discard``: the mapped allocations with ``tags`` released, contents dropped."""
        if isinstance(tags, str):
            tags = (tags,)
        discarded = 0
        for data in self.pointer_to_data.values():
            a = _alloc_of(data.handle)
            if data.tag not in tags or a is None or not a.mapped:
                continue
            data.cpu_backup_tensor = None
            unmap_and_release(data.handle)
            discarded += data.handle[1]
        logger.info("CuMemAllocator: discarded %.2f GiB for tags %s.", discarded / 1024**3, tags)
        _fake.log_event("allocator_discard", allocator=type(self).__name__, tags=list(tags), nbytes=discarded)

    if _fake.V < _fake.Version("0.28.0"):  # in the 0.28.0 wheel; its callers (Worker.discard) from 0.31.0
        del discard

    def _expandable_toggle(self) -> bool:
        return _expandable_enabled_for_pool()

    def _expandable_off(self):
        """Expandable segments off for the pool; returns what puts the setting back. 0.20.1-0.30.x write the
        bare ``expandable_segments:False`` / ``:True`` (torch then drops the user's ``max_split_size_mb`` ...);
        0.31+ rewrite the whole live string with that one field flipped, and put the string back
        (``alloc_conf.with_conf_flag`` / ``set_alloc_conf``)."""
        if _fake.V >= _fake.Version("0.31.0"):
            from vllm.device_allocator import alloc_conf
            prev_conf = alloc_conf.current_alloc_conf()
            alloc_conf.set_alloc_conf(alloc_conf.with_conf_flag(prev_conf, alloc_conf.EXPANDABLE_SEGMENTS, False))
            return lambda: alloc_conf.set_alloc_conf(prev_conf)
        self._set_expandable(False)
        return lambda: self._set_expandable(True)

    def _set_expandable(self, on: bool) -> None:
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{on}")

    @contextmanager
    def use_memory_pool(self, tag: str | None = None):
        if tag is None:
            tag = CuMemAllocator.default_tag
        assert isinstance(tag, str)
        expandable_was_enabled = self._expandable_toggle()
        if expandable_was_enabled:
            put_back = self._expandable_off()
        old_tag = self.current_tag
        self.current_tag = tag
        prev = DEVICE.active_pool
        DEVICE.active_pool = (self, tag)
        try:
            self.allocator_and_pools[tag] = (object(), object())
            yield
        finally:
            DEVICE.active_pool = prev
            self.current_tag = old_tag
            if expandable_was_enabled:
                put_back()

    def get_current_usage(self) -> int:
        return sum(data.handle[1] for data in self.pointer_to_data.values())
