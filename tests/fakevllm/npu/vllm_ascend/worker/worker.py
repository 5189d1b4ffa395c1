"""Mirrors vllm_ascend/worker/worker.py NPUWorker (worker_v1.py up to 0.12):
sleep/wake_up through CaMemAllocator and torch.npu.mem_get_info; NO
``reload_weights`` before vllm-ascend 0.24.0rc1 (so
``collective_rpc("reload_weights")`` raises vLLM's
NotImplementedError("Method 'reload_weights' is not implemented.")); sleep
does not check enable_sleep_mode."""
import torch
from packaging.version import Version

from vllm import _fake
from vllm.v1.worker.gpu_worker import Worker


class NPUWorker(Worker):
    _mem = "npu"

    def _mem_get_info(self):
        return torch.npu.mem_get_info()

    def _empty_cache(self):
        torch.npu.empty_cache()

    def _allocator(self):
        from vllm_ascend.device_allocator.camem import CaMemAllocator
        return CaMemAllocator.get_instance()

    def __getattribute__(self, name):
        if name == "reload_weights" and Version(_fake.ASCEND_VERSION) < Version("0.24.0rc1"):
            raise AttributeError(name)
        return super().__getattribute__(name)


NPUWorkerV1 = NPUWorker
