"""A level-2 sleep loses what it does not save: buffers at a kv_cache-first wake, and plain tensors.

Upstream: vllm-project/vllm#45619 (gate the level-2 buffer restore on the weights tag): Worker.wake_up
          restores the buffers saved by sleep(level=2) whatever the tags up to 0.26.x, gated from 0.27.0
          (read in the 0.25.0/0.26.0/0.27.0 wheels); vllm-ascend NPUWorker.wake_up is tag-blind in every
          release (0.23.0, 0.25.1rc1, main). Plain tensors: RFC vllm-project/vllm#53343,
          NVIDIA-NeMo/RL#2631, vllm#39934 -- Worker.sleep(level=2) saves named_buffers() only (0.24.0;
          0.33.0 adds sleep_preserve_parameter_names, parameters only, and the drafter's buffers); fixed
          in 0.34.0: level 2 discards only the pool allocations that hold nothing but parameters
          (Worker._discardable_parameters, device_allocator/__init__.py::discardable_allocations) and
          offloads the rest of the weights tag like level 1; _sleep_saved_buffers is gone
Affects:  vllm >=0.8.0,<0.27.0; vllm-ascend >=0.13.0 (vllm_ascend.worker.worker); a trainer that wakes
          kv_cache before weights after a level-2 sleep (TRL GOLD 0.25-0.29). Plain tensors: vLLM
          >=0.8.0,<0.34.0 and vllm-ascend >=0.13.0rc1 (level 2, tensors allocated in the weights pool).
          Module globals: vllm-ascend >=0.13.0 (ops/rotary_embedding.py ``_cos_cache`` / ``_sin_cache``;
          absent in 0.13.0rc1, there in 0.13.0, 0.18.0, 0.23.0; fix PR vllm-ascend#17217 open)
Remove:   buffers: when the shim's minimum vLLM is >=0.27.0 and vllm-ascend gates the restore; plain
          tensors: when the shim's minimum vLLM is >=0.34.0 and vllm-ascend's level-2 sleep keeps them;
          module globals: when vllm-ascend's level-2 sleep keeps its rope caches (vllm-ascend#17217)

Buffers: the saved buffers are copied into the still-unmapped weight memory:
CUDA_ERROR_ILLEGAL_ADDRESS (vllm#45619) or the NPU MTE fault, and the saved
copies are dropped; no weight push restores them (they are in no checkpoint). The patch wraps the worker's ``wake_up``: a wake without ``weights``
leaves the saved buffers for the weights wake (``shim.vllm.weights.buffers``). The probe
reads ``wake_up`` and stands down where the restore already waits for the
weights tag.

Plain tensors (``vllm-level2-tensors``): a tensor a module keeps as a plain attribute (MLA's
``W_UK_T`` / ``W_UV`` of a quantized ``kv_b_proj``, the attention layers' ``q_range`` constants)
lives in the weights pool, so the level-2 sleep discards it, and neither the push nor the buffer
restore writes it back. The patch wraps the worker's ``sleep`` (host copies of those storages
before a level-2 sleep, counted in the shim's sleep line) and ``wake_up`` (written back once the
weights are mapped); it skips views of parameters and buffers and, where the pushes go through
vLLM's reload (``trl-push-reprocess``), the attention layers' attributes the push re-derives
(``shim.vllm.weights.buffers``). From vLLM 0.34 the record stands down as fixed upstream (range; the probe
also stands down on a pre-release whose ``Worker`` has ``_discardable_parameters``); the probe reads
``sleep`` and stands down where it saves module attributes itself.

Module globals (``vllm-ascend-level2-tensors`` only): vllm-ascend 0.13.0+ keeps the MLA / MTP rope caches
``_cos_cache`` / ``_sin_cache`` as globals of ``vllm_ascend/ops/rotary_embedding.py``
(``_record_cos_and_sin_cache_interleaved`` in ``AscendRotaryEmbedding.__init__``: one new tensor, made
while ``load_model`` builds the model in the weights pool). No module holds them, so the attribute walk
misses them; the level-2 sleep discards them, ``NPUWorker.wake_up`` restores buffers only, and the MLA
path (``get_cos_and_sin_mla``) reads them at every step: silently wrong outputs. The NPU record's
``sleep`` wrapper also keeps every weights-pool storage a global of a ``vllm_ascend`` module references
(not a parameter's or a buffer's), restored with the rest.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed


def _binding(class_name):
    def probe(module):
        from shim.vllm.weights import buffers

        cls = getattr(module, class_name, None)
        if cls is None:
            return changed(f"no {class_name}")
        return buffers.probe_restore(cls)

    def apply(module, patcher):
        from shim.vllm.weights import buffers

        patcher.wrap(getattr(module, class_name), "wake_up", buffers.keep_buffers)

    return probe, apply


_probe_gpu, _apply_gpu = _binding("Worker")
_probe_npu, _apply_npu = _binding("NPUWorker")


def _plain_binding(class_name, save="save_plain"):
    def probe(module):
        from shim.vllm.weights import buffers

        cls = getattr(module, class_name, None)
        if cls is None or not callable(getattr(cls, "wake_up", None)):
            return changed(f"no {class_name}.sleep/wake_up")
        return buffers.probe_plain(cls)

    def apply(module, patcher):
        from shim.vllm.weights import buffers

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
    verified="CPU: vLLM stand-in 0.24.0 (tag-blind) and 0.27.0 (stands down)",
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
    verified="CPU: vLLM stand-in in NPU mode (vllm-ascend 0.13.0rc1 metadata)",
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
    verified="CPU: vLLM stand-in 0.24.0 (DeepSeek-V2 MLA, quantized kv_b_proj), 0.10.2 (matrices on the impl), "
             "0.33.0 (a plain attribute); 0.34.0 keeps it itself (stands down)",
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
    verified="CPU: vLLM stand-in in NPU mode (vllm-ascend 0.13.0rc1 metadata: MLA matrices; 0.23.0: the rope "
             "caches, greedy output differs without the shim, identical with it)",
)

PATCHES = [GPU, NPU, GPU_PLAIN, NPU_PLAIN]
