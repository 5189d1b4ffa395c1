"""Mirrors vllm_ascend/worker/worker.py NPUWorker (worker_v1.py up to 0.12):
sleep/wake_up through CaMemAllocator and torch.npu.mem_get_info; NO
``reload_weights`` before vllm-ascend 0.24.0rc1 (so
``collective_rpc("reload_weights")`` raises vLLM's
NotImplementedError("Method 'reload_weights' is not implemented.")); sleep
does not check enable_sleep_mode.

Workspace (FAKEVLLM_NPU_WORKSPACE_MB, default 0): vllm-ascend#9563 reports ~240 MB of device
memory allocated after every wake besides the weights and the KV cache ("suspected workspace").
The stand-in allocates it as a plain (caching-allocator) block when the KV cache is woken and
frees it when the worker sleeps, so it lands in the allocator's cache; whether that cache is
given back depends on ``CaMemAllocator.sleep`` (0.19.1rc1+: empty_cache) and on the caller.
Restoring the level-2 buffers ignores ``tags`` in every vllm-ascend release (``Worker.wake_up``).

MoE re-layout at the wake (vllm-ascend 0.12.0rc1 - 0.25.1rc1, read in the 0.12.0rc1, 0.13.0, 0.18.0,
0.23.0, 0.24.0rc1 and 0.25.1rc1 wheels; removed by PR #13012 in 0.26.0rc1; vllm-ascend#11548, #12226):
after the allocator restored the weights, ``wake_up`` (unquantized model, a wake that includes
``weights``) replaces every ``w2_weight`` whose dim 2 is the hidden size and every ``w13_weight``
whose dim 1 is with a NEW Parameter holding ``param.transpose(1, 2)`` -- on weights already in the
processed layout (``vllm_ascend.ops.fused_moe``), so they leave it.

Own methods: the real ``NPUWorker`` subclasses vLLM's ``WorkerBase``, not ``gpu_worker.Worker`` (0.23.0
``worker.py:89``), and defines ``__init__`` (:90), ``sleep`` (:216), ``wake_up`` (:241), ``load_model`` (:681)
and ``initialize_from_config`` (:907) itself, so a wrapper on vLLM's ``Worker`` reaches none of them. The
stand-in shares ``Worker``'s code but keeps its own copies (``gpu_worker.OWN``, taken before any wrapper) and
its own ``sleep``, which never calls ``Worker.sleep``.

Real code: with ``FAKEVLLM_ASCEND_WORKER_SRC`` set to a real ``vllm_ascend/worker/worker.py`` (from a
vllm-ascend wheel), ``NPUWorker.wake_up`` IS that file's method (``vllm._fake.real_code``), run
against this stand-in's allocator, config and model."""
import os

import torch
from packaging.version import Version
from vllm import _fake
from vllm._fake.device import DEVICE
from vllm.v1.worker import gpu_worker
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

    _workspace = None

    def _workspace_bytes(self) -> int:
        return int(float(os.environ.get("FAKEVLLM_NPU_WORKSPACE_MB") or 0) * 2**20)

    _saves_buffers = True  # its own level-2 sleep saves named_buffers() in every release
    __init__ = gpu_worker.OWN["__init__"]
    load_model = gpu_worker.OWN["load_model"]
    initialize_from_config = gpu_worker.OWN["initialize_from_config"]

    def sleep(self, level: int = 1) -> None:
        """vllm-ascend 0.23.0 ``NPUWorker.sleep``: the level-2 buffers saved, ``CaMemAllocator.sleep``, the
        freed-bytes log line (``enable_sleep_mode_extra_cleanup`` off)."""
        if self._workspace is not None:
            DEVICE.free(self._workspace)
            self._workspace = None
        free_bytes_before_sleep = self._mem_get_info()[0]
        if level == 2:
            model = self.model_runner.model
            self._sleep_saved_buffers = {name: buffer.cpu().clone() for name, buffer in model.named_buffers()}
        allocator = self._allocator()
        allocator.sleep(offload_tags=("weights",) if level == 1 else tuple())
        free_bytes_after_sleep, total = self._mem_get_info()
        freed_bytes = free_bytes_after_sleep - free_bytes_before_sleep
        used_bytes = total - free_bytes_after_sleep
        assert freed_bytes >= 0, "Memory usage increased after sleeping."
        _fake.log_event("worker_sleep", level=level, freed_bytes=freed_bytes, used_bytes=used_bytes,
                        pool_bytes=allocator.get_current_usage())

    def wake_up(self, tags=None) -> None:
        """vllm-ascend 0.23.0 ``NPUWorker.wake_up``: allocator wake, then the level-2 buffer restore
        without looking at ``tags`` (unchanged up to 0.25.1rc1 and main)."""
        allocator = self._allocator()
        allocator.wake_up(tags=tags)
        hidden_size = self.vllm_config.model_config.hf_text_config.hidden_size
        model = self.model_runner.model
        if (Version(_fake.ASCEND_VERSION) < Version("0.26.0rc1") and self.vllm_config.quant_config is None
                and (tags is None or "weights" in tags)):
            for name, param in model.named_parameters():  # the MoE re-layout (see the module doc)
                if ("w2_weight" in name and param.shape[2] == hidden_size) or (
                        "w13_weight" in name and param.shape[1] == hidden_size):
                    module_name, _, param_name = name.rpartition(".")
                    relaid = torch.nn.Parameter(param.transpose(1, 2), requires_grad=False)
                    setattr(model.get_submodule(module_name), param_name, relaid)
        # Restore the buffers after level 2 sleep
        if len(self._sleep_saved_buffers):
            self._restore_saved_buffers(tags)
        self._log_wake(tags)
        if (tags is None or "kv_cache" in tags) and self._workspace is None and self._workspace_bytes():
            self._workspace = DEVICE.allocate(self._workspace_bytes(), label="npu_workspace")

    def __getattribute__(self, name):
        if name == "reload_weights" and Version(_fake.ASCEND_VERSION) < Version("0.24.0rc1"):
            raise AttributeError(name)
        return super().__getattribute__(name)


if _fake.ASCEND_WORKER_SRC:  # the real vllm-ascend method, on the stand-in
    import typing

    from vllm._fake import real_code

    from vllm_ascend import envs as envs_ascend
    from vllm_ascend.ascend_config import get_ascend_config
    from vllm_ascend.device_allocator.camem import CaMemAllocator

    NPUWorker.wake_up = real_code.method(_fake.ASCEND_WORKER_SRC, "NPUWorker", "wake_up", {
        "torch": torch, "CaMemAllocator": CaMemAllocator, "get_ascend_config": get_ascend_config,
        "envs_ascend": envs_ascend, "Optional": typing.Optional})

NPUWorkerV1 = NPUWorker
