"""A level-2 sleep loses what it does not save: buffers at a kv_cache-first wake, and plain tensors.

Upstream: buffers vllm-project/vllm#45619 (fixed in 0.27.0; vllm-ascend tag-blind in every release); plain tensors
          RFC vllm-project/vllm#53343, NVIDIA-NeMo/RL#2631, vllm#39934 (fixed in 0.34.0), vllm-ascend#17217
Affects:  buffers: vllm >=0.8.0,<0.27.0 and vllm-ascend >=0.13.0, a kv_cache wake before the weights wake (TRL
          GOLD 0.25-0.29); plain tensors: vllm >=0.8.0,<0.34.0 and vllm-ascend >=0.13.0rc1 at level 2
Remove:   each record when the shim's minimum vLLM / vllm-ascend fixes its part (the records' ranges)

``Worker.sleep(level=2)`` saves ``named_buffers()`` only and the wake copies them back whatever the tags:
into still-unmapped weight memory at a kv_cache-first wake (CUDA_ERROR_ILLEGAL_ADDRESS, NPU MTE fault), after
which the saved copies are gone, and no push restores them (they are in no checkpoint). A tensor kept as a
plain attribute (MLA's ``W_UK_T`` / ``W_UV``) or a module global in the weights pool is discarded outright.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed


def _binding(class_name):
    def probe(module):
        from shim.vllm import buffers

        cls = getattr(module, class_name, None)
        if cls is None:
            return changed(f"no {class_name}")
        return buffers.probe_restore(cls)

    def apply(module, patcher):
        from shim.vllm import buffers

        patcher.wrap(getattr(module, class_name), "wake_up", buffers.keep_buffers)

    return probe, apply


_probe_gpu, _apply_gpu = _binding("Worker")
_probe_npu, _apply_npu = _binding("NPUWorker")


def _plain_binding(class_name, save="save_plain"):
    def probe(module):
        from shim.vllm import buffers

        cls = getattr(module, class_name, None)
        if cls is None or not callable(getattr(cls, "wake_up", None)):
            return changed(f"no {class_name}.sleep/wake_up")
        return buffers.probe_plain(cls)

    def apply(module, patcher):
        from shim.vllm import buffers

        cls = getattr(module, class_name)
        patcher.wrap(cls, "sleep", getattr(buffers, save))
        patcher.wrap(cls, "wake_up", buffers.restore_plain)

    return probe, apply


_probe_gpu_plain, _apply_gpu_plain = _plain_binding("Worker")
_probe_npu_plain, _apply_npu_plain = _plain_binding("NPUWorker", save="save_plain_and_globals")

GPU = Patch(
    id="vllm-level2-buffers",
    tested_at=("vllm", "0.24.0"),
    issue="vllm-project/vllm#45619",
    distribution="vllm",
    affected=">=0.8.0,<0.27.0",
    fixed_in="0.27.0",
    module="vllm.v1.worker.gpu_worker",
    apply=_apply_gpu,
    probe=_probe_gpu,
    summary="a wake without the weights tag after a level-2 sleep keeps the saved buffers for the weights wake",
    verified=("CPU: stand-in (vLLM 0.24.0 CUDA, NPU mode): `kv_cache`-first wake faults without the shim "
              "(asserted), buffers and greedy output identical with it; vLLM 0.27.0: stands down. Real TRL GOLD "
              "0.27.2 / 0.29.1: with the shim's GOLD fix alone the `kv_cache` wake faults in the buffer restore "
              "(asserted), every rollout on the trained weights with this patch"),
    changes=("the worker's `wake_up`: a wake without `weights` leaves the buffers saved by the level-2 sleep (rope "
             "`inv_freq` / `cos_sin_cache`, in no checkpoint) for the weights wake, instead of copying them into "
             "unmapped weight memory (CUDA_ERROR_ILLEGAL_ADDRESS / NPU MTE fault) and dropping them. The probe "
             "reads `wake_up` and stands down where the restore waits for the weights tag Upstream, read in the "
             "0.25.0/0.26.0/0.27.0 wheels: `Worker.wake_up` restores the buffers saved by `sleep(level=2)` "
             "whatever the tags up to 0.26.x, gated on the weights tag from 0.27.0 (vllm#45619); vllm-ascend "
             "`NPUWorker.wake_up` is tag-blind in every release (0.23.0, 0.25.1rc1, main). The wrapper is "
             "`shim.vllm.buffers`."),
)

NPU = Patch(
    id="vllm-ascend-level2-buffers",
    tested_at=("vllm-npu", "0.24.0"),
    issue="vllm-ascend NPUWorker.wake_up (as vllm#45619, unfixed)",
    distribution="vllm-ascend",
    affected=">=0.13.0rc1",
    module="vllm_ascend.worker.worker",
    apply=_apply_npu,
    probe=_probe_npu,
    summary="as vllm-level2-buffers, on vllm-ascend's NPUWorker (else an MTE fault at the kv_cache wake)",
    changes=GPU.changes,
    verified=GPU.verified,
)

GPU_PLAIN = Patch(
    id="vllm-level2-tensors",
    tested_at=("vllm", "0.24.0"),
    issue="vllm-project/vllm#53343",
    distribution="vllm",
    affected=">=0.8.0,<0.34.0",
    fixed_in="0.34.0",
    module="vllm.v1.worker.gpu_worker",
    apply=_apply_gpu_plain,
    probe=_probe_gpu_plain,
    summary="a level-2 sleep keeps the plain tensor attributes allocated in the weights pool (host copies, restored "
            "at the weights wake; views of parameters/buffers and what the next push re-derives skipped)",
    verified=("CPU: stand-in 0.24.0 (CUDA, NPU), 0.10.2 (matrices on `impl`), 0.33.0 (a plain attribute lost "
              "without the shim, kept with it), 0.34.0 (kept without the shim; the record stands down as fixed "
              "upstream and the stale-rollout alarm does not name it): after a level-2 sleep and a raw push of the "
              "same weights the MLA matrices and the greedy output differ without the shim (asserted), identical "
              "with it; unquantized (views): nothing copied. NPU, vllm-ascend 0.23.0 (DeepSeek-V2 MLA): "
              "`_cos_cache`/`_sin_cache` garbage and the greedy output differs without the shim (asserted), both "
              "back and identical output with it (1 storage, 16 KiB kept); 0.13.0rc1: no such caches, nothing kept"),
    changes=("the worker's `sleep`: before a level-2 sleep, host copies of every plain tensor attribute (modules "
             "and their `impl`) whose storage lies in the weights pool, except views of parameters/buffers and, "
             "where the pushes go through `shim.vllm.reload`, the attention layers' attributes; `wake_up`: written "
             "back once the weights tag is mapped (any wake order); the shim's sleep line says `plain tensors "
             "kept: N storage(s), B bytes`. The NPU record also keeps the storages referenced by globals of "
             "`vllm_ascend` modules (in the weights pool, not a parameter's or a buffer's): vllm-ascend 0.13.0+'s "
             "MLA/MTP rope caches `_cos_cache`/`_sin_cache` (`vllm_ascend/ops/rotary_embedding.py`, "
             "`_record_cos_and_sin_cache_interleaved` in `AscendRotaryEmbedding.__init__`: one tensor made in the "
             "weights pool at `load_model`, read by `get_cos_and_sin_mla` at every MLA/SFA step, restored by "
             "nothing in 0.23.0; fix PR vllm-ascend#17217 open). The probe needs the class's own `sleep`/`wake_up` "
             "and a `sleep` that saves `named_buffers`; it stands down where `sleep` saves module attributes, and "
             "as fixed upstream from vLLM 0.34 (range `<0.34.0`; the probe also where the worker has "
             "`_discardable_parameters`: 0.34 discards only the allocations holding nothing but parameters and "
             "offloads the rest) Upstream: `Worker.sleep(level=2)` saves `named_buffers()` only (0.24.0; 0.33.0 "
             "adds `sleep_preserve_parameter_names`, parameters only, and the drafter's buffers); fixed in 0.34.0: "
             "level 2 discards only the pool allocations that hold nothing but parameters "
             "(`Worker._discardable_parameters`, `device_allocator/__init__.py::discardable_allocations`) and "
             "offloads the rest of the weights tag like level 1; `_sleep_saved_buffers` is gone. Plain attributes "
             "lost: MLA's `W_UK_T` / `W_UV` of a quantized `kv_b_proj`, the attention layers' `q_range` constants. "
             "Module globals: `_cos_cache` / `_sin_cache` are absent in vllm-ascend 0.13.0rc1, there in 0.13.0, "
             "0.18.0, 0.23.0; no module holds them, so the attribute walk misses them, `NPUWorker.wake_up` "
             "restores buffers only, and the MLA path reads them at every step: silently wrong outputs. Remove: "
             "plain tensors when the shim's minimum vLLM is >=0.34.0 and vllm-ascend's level-2 sleep keeps them; "
             "module globals when vllm-ascend's level-2 sleep keeps its rope caches (vllm-ascend#17217)."),
)

NPU_PLAIN = Patch(
    id="vllm-ascend-level2-tensors",
    tested_at=("vllm-npu", "0.24.0"),
    issue="vllm-project/vllm#53343 (vllm-ascend NPUWorker.sleep saves named_buffers only)",
    distribution="vllm-ascend",
    affected=">=0.13.0rc1",
    module="vllm_ascend.worker.worker",
    apply=_apply_npu_plain,
    probe=_probe_npu_plain,
    summary="as vllm-level2-tensors, on vllm-ascend's NPUWorker, plus the weights-pool tensors held by vllm_ascend "
            "module globals (the MLA/MTP rope caches _cos_cache/_sin_cache, vllm-ascend#17217)",
    changes=GPU_PLAIN.changes,
    verified=GPU_PLAIN.verified,
)

PATCHES = [GPU, NPU, GPU_PLAIN, NPU_PLAIN]
