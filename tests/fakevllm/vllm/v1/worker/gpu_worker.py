"""Mirrors vllm/v1/worker/gpu_worker.py ``Worker``: ``init_device`` (startup
memory check), ``load_model`` (under ``CuMemAllocator.use_memory_pool(tag="weights")``
when sleep mode is on), ``initialize_from_config`` (KV cache under
``use_memory_pool(tag="kv_cache")``), ``sleep`` (level 1 offloads tag "weights",
level 2 offloads nothing but saves ``model.named_buffers()``), ``wake_up``
(restores the saved buffers; tag-blind before 0.27.0, see ``wake_up``), ``reload_weights``.

0.33 adds ``sleep_preserve_parameter_names`` (``_save_sleep_parameters``: host copies of the matching
parameters, ``draft.*`` for the drafter's, restored at the weights wake) and saves the drafter's buffers
too. 0.34 (``v1/worker/gpu_worker.py`` ``_discardable_parameters`` / ``sleep`` / ``wake_up``) drops the saved
buffers: a level-2 sleep hands the storage addresses of the parameters it may discard (all of them, target
and drafter, less those ``sleep_preserve_parameter_names`` matches) to ``CuMemAllocator.sleep``, which
discards only the allocations holding nothing but those and offloads the rest of the weights tag like
level 1 (buffers, LoRA slots, plain tensor attributes); ``wake_up`` restores nothing itself.
"""
from __future__ import annotations

import fnmatch
from contextlib import nullcontext

import torch

from vllm import _fake
from vllm._fake.device import DEVICE
from vllm.logger import init_logger
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

logger = init_logger(__name__)
GiB_bytes = 1 << 30
RUNTIME_BYTES = 48 << 20    # 0.34: the runner's state in the "runtime" tag (size: the stand-in's choice)
WORKSPACE_BYTES = 16 << 20  # 0.34: the workspace manager's scratch in the "workspace" tag


_warned_draft: list = []  # logger.warning_once upstream
class WorkerBase:
    """Mirrors vllm/v1/worker/worker_base.py WorkerBase (subset)."""

    def __init__(self, vllm_config, local_rank=0, rank=0, distributed_init_method=None,
                 is_driver_worker=True):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.local_rank = local_rank
        self.rank = rank
        self.is_driver_worker = is_driver_worker
        self.model_runner = None

    def check_health(self) -> None:
        return None


class Worker(WorkerBase):
    _mem = "cuda"
    _saves_buffers = _fake.V < _fake.Version("0.34.0")
    """Whether a level-2 sleep saves buffers itself (0.34 dropped ``_sleep_saved_buffers``; vllm-ascend's
    ``NPUWorker``, which shares ``__init__``, still does)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if self._saves_buffers:
            self._sleep_saved_buffers: dict[str, torch.Tensor] = {}
            self._sleep_saved_parameters: dict[str, torch.Tensor] = {}
            self._sleep_saved_draft_buffers: dict[str, torch.Tensor] = {}

    # device helpers (torch.cuda.* here, torch.npu.* in vllm_ascend)
    def _mem_get_info(self):
        return torch.cuda.mem_get_info()

    def _empty_cache(self):
        torch.cuda.empty_cache()

    def _allocator(self):
        from vllm.device_allocator.cumem import CuMemAllocator
        return CuMemAllocator.get_instance()

    def init_device(self):
        self._empty_cache()
        free, total = self._mem_get_info()
        self.init_snapshot = (free, total)
        requested = self.cache_config.gpu_memory_utilization * total
        if free < requested:
            raise ValueError(
                f"Free memory on device ({free / GiB_bytes:.2f}/{total / GiB_bytes:.2f} GiB) on startup "
                f"is less than desired GPU memory utilization "
                f"({self.cache_config.gpu_memory_utilization}, {requested / GiB_bytes:.2f} GiB). Decrease "
                f"GPU memory utilization or reduce GPU memory used by other processes.")
        self.model_runner = GPUModelRunner(self.vllm_config, self._mem)
        if _fake.V >= _fake.Version("0.34.0") and self.vllm_config.model_config.enable_sleep_mode:
            # 0.34 _init_workspace_and_model_runner: the runner's own state under tag "runtime" (offloaded at
            # a sleep, woken with any tag: cumem.py DEFERRABLE_TAGS are weights and kv_cache only)
            with self._allocator().use_memory_pool(tag="runtime"):
                self._runtime_alloc = DEVICE.allocate(RUNTIME_BYTES, label="runtime")

    def load_model(self) -> None:
        if self.vllm_config.model_config.enable_sleep_mode:
            allocator = self._allocator()
            if _fake.V < _fake.Version("0.34.0"):  # gone in 0.34 (the runtime tag is allocated before the model)
                assert allocator.get_current_usage() == 0, "Sleep mode can only be used for one instance per process."
            context = allocator.use_memory_pool(tag="weights")
        else:
            context = nullcontext()
        with context:
            self.model_runner.load_model()

    def determine_available_memory(self) -> int:
        """v1: requested_memory (utilization x total) minus this instance's
        non-KV memory (weights, activations, non-torch growth since startup)."""
        if self.cache_config.kv_cache_memory_bytes is not None:
            return int(self.cache_config.kv_cache_memory_bytes)
        free, total = self._mem_get_info()
        requested = int(self.cache_config.gpu_memory_utilization * total)
        non_kv = max(self.init_snapshot[0] - free, 0)
        avail = requested - non_kv
        if avail <= 0:
            raise ValueError("No available memory for the cache blocks. Try increasing "
                             "`gpu_memory_utilization` when initializing the engine.")
        return int(avail)

    def initialize_from_config(self, kv_cache_bytes: int) -> None:
        if self.vllm_config.model_config.enable_sleep_mode:
            context = self._allocator().use_memory_pool(tag="kv_cache")
        else:
            context = nullcontext()
        with context:
            self.model_runner.initialize_kv_cache(kv_cache_bytes)

    def compile_or_warm_up_model(self) -> None:
        if _fake.V >= _fake.Version("0.34.0") and self.vllm_config.model_config.enable_sleep_mode:
            # 0.34 init_workspace_manager(alloc_context=pool "workspace"): scratch discarded at a sleep
            with self._allocator().use_memory_pool(tag="workspace"):
                self._workspace_alloc = DEVICE.allocate(WORKSPACE_BYTES, label="workspace")
        kv_cache = self.model_runner.extensible_kv_cache
        if kv_cache is not None:  # 0.34: measure_kv_cache_blocks after the warm-up caps torch
            from vllm.v1.worker.extensible_kv_cache import measure_kv_cache_blocks
            measure_kv_cache_blocks(kv_cache)
        from vllm.utils import gc_utils
        if gc_utils.WORKER_FREEZES:  # 0.24.0 gpu_worker.py:774, after the warm-up
            gc_utils.freeze_gc_heap()
        return None

    def get_model(self):
        return self.model_runner.get_model()

    def get_draft_model(self):
        """0.33+ ``Worker.get_draft_model`` (the runner's drafter model, or None)."""
        drafter = getattr(self.model_runner, "drafter", None)
        return getattr(drafter, "model", None)

    def _preserve_patterns(self) -> list:
        return list(getattr(self.model_config, "sleep_preserve_parameter_names", None) or ())

    def _get_sleep_parameters(self, model) -> dict:
        """0.33+: the target's parameters by name, and the drafter's (not shared with the target) as ``draft.*``."""
        parameters = dict(model.named_parameters())
        draft = self.get_draft_model()
        if draft is not None:
            shared = {id(p) for p in parameters.values()}
            parameters.update((f"draft.{n}", p) for n, p in draft.named_parameters() if id(p) not in shared)
        return parameters

    def _preserved_names(self, parameters: dict) -> set:
        names: set = set()
        for pattern in self._preserve_patterns():
            matches = fnmatch.filter(parameters, pattern)
            if not matches and pattern != "draft.*":
                raise ValueError(f"No parameter matches sleep retention: {pattern}")
            names.update(matches)
        return names

    def _save_sleep_parameters(self, model) -> None:
        """0.33: host copies of the parameters ``sleep_preserve_parameter_names`` matches."""
        parameters = self._get_sleep_parameters(model)
        keep = self._preserved_names(parameters) if self._preserve_patterns() else set()
        self._sleep_saved_parameters = {n: p.detach().cpu().clone() for n, p in parameters.items() if n in keep}

    def _discardable_parameters(self, model) -> set:
        """0.34: storage addresses of the parameters a level-2 sleep may discard (all but the preserved ones);
        one warning where the drafter's are among them."""
        parameters = self._get_sleep_parameters(model)
        storage = {n: p.untyped_storage().data_ptr() for n, p in parameters.items()}
        preserved = {storage[n] for n in self._preserved_names(parameters)}
        draft_names = fnmatch.filter(storage, "draft.*")
        if draft_names and not any(fnmatch.filter(draft_names, p) for p in self._preserve_patterns()) \
                and not _warned_draft:
            _warned_draft.append(True)
            logger.warning("Level 2 sleep discards draft model weights; reload_weights restores only the target. "
                           "Unless the draft is updated separately, set --sleep-preserve-parameter-names "
                           "'draft.*' to keep them.")
        return set(storage.values()) - preserved

    def _sleep_upto_033(self, level: int = 1) -> None:
        """``Worker.sleep`` up to 0.33: level 2 saves the buffers (0.33: also the preserved parameters and the
        drafter's buffers) and discards the whole weights tag."""
        free_bytes_before_sleep = self._mem_get_info()[0]
        if level == 2:
            model = self.model_runner.model
            if _fake.V >= _fake.Version("0.33.0"):
                self._save_sleep_parameters(model)
            self._sleep_saved_buffers = {name: buffer.cpu().clone() for name, buffer in model.named_buffers()}
            draft = self.get_draft_model() if _fake.V >= _fake.Version("0.33.0") else None
            if draft is not None:
                self._sleep_saved_draft_buffers = {n: b.cpu().clone() for n, b in draft.named_buffers()}
        allocator = self._allocator()
        allocator.sleep(offload_tags=("weights",) if level == 1 else tuple())
        self._log_sleep(level, free_bytes_before_sleep, allocator)

    def _sleep_034(self, level: int = 1) -> None:
        """``Worker.sleep`` from 0.34: nothing saved here; level 2 lets the allocator discard the allocations
        holding only discardable parameters and offload the rest of the weights tag."""
        free_bytes_before_sleep = self._mem_get_info()[0]
        discardable = self._discardable_parameters(self.model_runner.model) if level == 2 else set()
        allocator = self._allocator()
        if self.model_runner.extensible_kv_cache is not None:  # outside the pool: pages dropped, the torch cap stays
            self.model_runner.extensible_kv_cache.release_physical()
        allocator.sleep(offload_tags=("weights", "runtime", "cudagraph"), discardable=discardable)  # CuMemBackend
        self._log_sleep(level, free_bytes_before_sleep, allocator)

    sleep = _sleep_034 if _fake.V >= _fake.Version("0.34.0") else _sleep_upto_033

    def _log_sleep(self, level: int, free_bytes_before_sleep: int, allocator) -> None:
        free_bytes_after_sleep, total = self._mem_get_info()
        freed_bytes = free_bytes_after_sleep - free_bytes_before_sleep
        used_bytes = total - free_bytes_after_sleep
        assert freed_bytes >= 0, "Memory usage increased after sleeping."
        logger.info("Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use.",
                    freed_bytes / GiB_bytes, used_bytes / GiB_bytes)
        _fake.log_event("worker_sleep", level=level, freed_bytes=freed_bytes, used_bytes=used_bytes,
                        pool_bytes=allocator.get_current_usage())

    def _wake_up_tag_blind(self, tags: list[str] | None = None) -> None:
        """``Worker.wake_up`` up to vLLM 0.26.x (read in the 0.10.2-0.26.0 wheels): the buffers
        saved by a level-2 sleep (rope cos_sin_cache, inv_freq) are restored whatever ``tags``
        says; after ``wake_up(["kv_cache"])`` the copy into the still-unmapped weight memory
        faults (vllm#45619: CUDA_ERROR_ILLEGAL_ADDRESS; NPU: MTE out of range) and the saved
        copies are gone, so a later weights wake could not restore them anyway."""
        allocator = self._allocator()
        allocator.wake_up(tags)
        # Restore the buffers after level 2 sleep
        if len(self._sleep_saved_buffers):
            self._restore_saved_buffers(tags)
        self._log_wake(tags)

    def _wake_up_gated(self, tags: list[str] | None = None) -> None:
        """``Worker.wake_up`` from vLLM 0.27.0: the restore waits for the weights tag (0.33: the preserved
        parameters and the drafter's buffers too)."""
        allocator = self._allocator()
        allocator.wake_up(tags)
        wake_weights = tags is None or "weights" in tags
        if wake_weights and self._sleep_saved_parameters:
            parameters = self._get_sleep_parameters(self.model_runner.model)
            with torch.no_grad():
                for name, value in self._sleep_saved_parameters.items():
                    parameters[name].copy_(value)
            self._sleep_saved_parameters = {}
        if wake_weights and len(self._sleep_saved_buffers):
            self._restore_saved_buffers(tags)
        if wake_weights and self._sleep_saved_draft_buffers:
            draft = self.get_draft_model()
            if draft is not None:
                for name, buffer in draft.named_buffers():
                    if name in self._sleep_saved_draft_buffers:
                        buffer.data.copy_(self._sleep_saved_draft_buffers[name])
            self._sleep_saved_draft_buffers = {}
        self._log_wake(tags)

    def _wake_up_034(self, tags: list[str] | None = None) -> None:
        """``Worker.wake_up`` from vLLM 0.34: the allocator restores what the sleep offloaded; nothing saved here;
        the extensible KV cache backed again when ``kv_cache`` wakes."""
        self._allocator().wake_up(tags)
        self._recommit_kv(tags)
        self._log_wake(tags)

    def _restore_saved_buffers(self, tags) -> None:
        model = self.model_runner.model
        n = len(self._sleep_saved_buffers)
        if not self.model_runner._weights_accessible():
            self._sleep_saved_buffers = {}
            _fake.log_event("buffer_restore", lost=True, n_buffers=n, tags=tags,
                            note="weights tag unmapped: saved buffers copied into unmapped memory and dropped")
            # vllm#45619: "the restore loop executed buffer.data.copy_(saved) into a still-unmapped VA,
            # raising CUDA_ERROR_ILLEGAL_ADDRESS" (NPU: the MTE fault), after the saved copies were dropped.
            from vllm.v1.worker.gpu_model_runner import _device_fault
            raise _device_fault()
        for name, buffer in model.named_buffers():
            if name in self._sleep_saved_buffers:
                buffer.data.copy_(self._sleep_saved_buffers[name].data)
        self._sleep_saved_buffers = {}
        _fake.log_event("buffer_restore", lost=False, n_buffers=n, tags=tags)

    def _recommit_kv(self, tags) -> None:
        """0.34 ``Worker.wake_up``: the extensible KV cache backed again when ``kv_cache`` wakes."""
        kv_cache = self.model_runner.extensible_kv_cache
        if kv_cache is not None and (tags is None or "kv_cache" in tags):
            kv_cache.recommit()

    def _log_wake(self, tags) -> None:
        r = self.model_runner
        _fake.log_event("worker_wake_up", tags=tags, weights_fp=r.weights_fp(),
                        is_checkpoint=r.weights_fp() == r.checkpoint_fp,
                        free_bytes=self._mem_get_info()[0])

    wake_up = (_wake_up_034 if _fake.V >= _fake.Version("0.34.0") else
               _wake_up_gated if _fake.V >= _fake.Version("0.27.0") else _wake_up_tag_blind)

    def discard(self, tags: tuple[str, ...]) -> None:
        """0.31+ ``Worker.discard`` (``v1/worker/gpu_worker.py``): the pool's allocations with ``tags``
        released without a copy (``sleep_mode_backend.discard`` -> ``CuMemAllocator.discard``); the
        executor marks them asleep, a later ``wake_up(tags)`` maps fresh pages."""
        kv_cache = self.model_runner.extensible_kv_cache
        if kv_cache is not None and "kv_cache" in tags:  # 0.34: outside the allocator pool, like in sleep
            kv_cache.release_physical()
        self._allocator().discard(tags)
        _fake.log_event("worker_discard", tags=list(tags), free_bytes=self._mem_get_info()[0])

    def reload_weights(self, *args, **kwargs) -> None:
        """0.34: inside ``kv_cache_lent_for_weight_update`` (torch's cap lifted for the update)."""
        kv_cache = self.model_runner.extensible_kv_cache
        if kv_cache is None:
            return self.model_runner.reload_weights(*args, **kwargs)
        from vllm.v1.worker.extensible_kv_cache import kv_cache_lent_for_weight_update
        with kv_cache_lent_for_weight_update(kv_cache, self.model_runner.model):
            return self.model_runner.reload_weights(*args, **kwargs)

    def reset_prefix_cache(self) -> bool:
        return self.model_runner.reset_prefix_cache()

    def add_lora(self, lora_request) -> bool:
        if self.model_runner.lora_manager is None:  # stand-in without LoRA enabled: as before
            return True
        return self.model_runner.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        if self.model_runner.lora_manager is None:
            return True
        return self.model_runner.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        if self.model_runner.lora_manager is None:
            return set()
        return self.model_runner.list_loras()


if _fake.V < _fake.Version("0.31.0"):
    del Worker.discard
if _fake.V < _fake.Version("0.34.0"):  # the names each release has (0.34: gpu_worker.py:297)
    del Worker._discardable_parameters
if _fake.V < _fake.Version("0.33.0"):  # 0.33: gpu_worker.py:276 / :295 and get_draft_model
    del Worker._save_sleep_parameters, Worker._get_sleep_parameters
if _fake.V < _fake.Version("0.27.0"):  # get_draft_model: in the 0.27.0 wheel, not in 0.24.0
    del Worker.get_draft_model

OWN = {name: vars(Worker)[name] for name in ("__init__", "load_model", "initialize_from_config")}
"""Worker's own functions, taken before anything wraps the class: vllm-ascend's ``NPUWorker`` (the stand-in's
shares this code) defines these itself, so a wrapper on ``Worker`` must not reach it (``vllm_ascend.worker.worker``)."""
