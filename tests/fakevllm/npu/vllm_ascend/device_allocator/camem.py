"""Mirrors vllm_ascend/device_allocator/camem.py CaMemAllocator: same design as
vLLM's CuMemAllocator on torch.npu; ``__init__`` asserts that the ENV STRING
PYTORCH_NPU_ALLOC_CONF has no "expandable_segments:True" (a run-time setting or
an env var rewritten after torch_npu initialised passes the assert while the
allocator still has expandable segments on); ``use_memory_pool`` does NOT
toggle expandable segments.

``sleep`` ends with ``gc.collect()`` + ``torch.npu.empty_cache()`` only from vllm-ascend
0.19.1rc1 (PR #7709; read in the v0.18.0 and v0.19.1rc1 tags): before that, blocks freed during
the sleep stay cached on the device (vllm-ascend#9563)."""
import gc
import os

import torch
from packaging.version import Version
from vllm import _fake
from vllm.device_allocator.cumem import CuMemAllocator


class CaMemAllocator(CuMemAllocator):
    instance = None

    @classmethod
    def get_instance(cls) -> "CaMemAllocator":
        if CaMemAllocator.instance is None:
            CaMemAllocator.instance = CaMemAllocator()
        return CaMemAllocator.instance

    def __init__(self):
        conf = os.environ.get("PYTORCH_NPU_ALLOC_CONF", "")
        assert "expandable_segments:True" not in conf, (
            "Expandable segments are not compatible with memory pool. "
            "Please track https://github.com/pytorch/pytorch/issues/147851 "
            "for the latest updates.")
        self.pointer_to_data = {}
        self.current_tag = CuMemAllocator.default_tag
        self.allocator_and_pools = {}
        self.python_malloc_callback = self._python_malloc_callback
        self.python_free_callback = self._python_free_callback

    def _sync(self):
        torch.npu.synchronize()

    def _empty_cache(self):
        torch.npu.empty_cache()

    def _after_sleep(self) -> None:
        if Version(_fake.ASCEND_VERSION) >= Version("0.19.1rc1"):
            gc.collect()
            self._empty_cache()

    def _expandable_toggle(self) -> bool:
        return False
