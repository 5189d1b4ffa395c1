"""Waking kv_cache before weights after a level-2 sleep loses the saved buffers (rope caches).

Upstream: vllm-project/vllm#45619 (gate the level-2 buffer restore on the weights tag): Worker.wake_up
          restores the buffers saved by sleep(level=2) whatever the tags up to 0.26.x, gated from 0.27.0
          (read in the 0.25.0/0.26.0/0.27.0 wheels); vllm-ascend NPUWorker.wake_up is tag-blind in every
          release (0.23.0, 0.25.1rc1, main)
Affects:  vllm >=0.8.0,<0.27.0; vllm-ascend >=0.13.0 (vllm_ascend.worker.worker); a trainer that wakes
          kv_cache before weights after a level-2 sleep (TRL GOLD 0.25-0.29)
Remove:   when the shim's minimum vLLM is >=0.27.0 and vllm-ascend gates the restore

The saved buffers are copied into the still-unmapped weight memory:
CUDA_ERROR_ILLEGAL_ADDRESS (vllm#45619) or the NPU MTE fault, and the saved
copies are dropped; no weight push restores them (they are in no checkpoint). The patch wraps the worker's ``wake_up``: a wake without ``weights``
leaves the saved buffers for the weights wake (``shim.vllm.buffers``). The probe
reads ``wake_up`` and stands down where the restore already waits for the
weights tag.
"""
from shim.engine.patch import Patch


def _binding(class_name):
    def probe(module):
        from shim.vllm import buffers

        cls = getattr(module, class_name, None)
        if cls is None:
            return f"upstream shape changed (no {class_name})"
        return buffers.probe_restore(cls)

    def apply(module, patcher):
        from shim.vllm import buffers

        patcher.wrap(getattr(module, class_name), "wake_up", buffers.keep_buffers)

    return probe, apply


_probe_gpu, _apply_gpu = _binding("Worker")
_probe_npu, _apply_npu = _binding("NPUWorker")

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

PATCHES = [GPU, NPU]
