"""vllm-ascend's wake re-lays the MoE expert weights the allocator just restored: shape mismatch at generate.

Upstream: vllm-project/vllm-ascend#11548, #12226 (bugs); fixed by PR #13012 in 0.26.0rc1
Affects:  vllm-ascend >=0.13.0rc1,<0.26.0rc1 (vllm_ascend.worker.worker; 0.12.0rc1's worker_v1.py has the same
          code), unquantized MoE models (w13_weight / w2_weight), every wake that includes the weights tag
Remove:   when the shim's minimum vllm-ascend is >=0.26.0rc1

``NPUWorker.wake_up`` transposes every fused expert weight whose layout matches the hidden size and sets it as a
NEW Parameter, after ``CaMemAllocator.wake_up`` restored those bytes already in the processed layout
(``npu_grouped_matmul``'s): the next forward fails with a shape mismatch, and attributes on the old Parameters
(a ``weight_loader`` a trainer attached) are gone.
"""
from shim.engine.patch import Patch


def probe(module):
    from shim.engine import probes
    from shim.vllm import moe_layout

    cls = getattr(module, "NPUWorker", None)
    if cls is None:
        return probes.changed("no NPUWorker in vllm_ascend.worker.worker")
    return moe_layout.probe_relayout(cls)


def apply(module, patcher):
    from shim.vllm import moe_layout

    patcher.wrap(module.NPUWorker, "wake_up", moe_layout.keep_layout)


PATCH = Patch(
    id="vllm-ascend-moe-wake-layout",
    tested_at=("vllm-npu", "0.24.0"),
    issue="vllm-project/vllm-ascend#11548",
    distribution="vllm-ascend",
    affected=">=0.13.0rc1,<0.26.0rc1",
    fixed_in="0.26.0rc1",
    module="vllm_ascend.worker.worker",
    apply=apply,
    probe=probe,
    summary="NPUWorker.wake_up's re-transpose of the MoE w13/w2 weights undone: the Parameters slept with "
            "are put back (layout, weight_loader and other attributes kept)",
    verified=("CPU: the REAL `NPUWorker.wake_up` of vllm-ascend 0.13.0, 0.23.0 and 0.25.1rc1, read from the wheels "
              "and compiled against the stand-in's NPU mode (`FAKEVLLM_ASCEND_WORKER_SRC`; the module cannot be "
              "imported on CPU), tiny Qwen3-MoE with vLLM's fused experts in vllm-ascend's processed layout: "
              "without the shim the first level-1 wake replaces the Parameters with transposed ones and the next "
              "generate fails with a shape mismatch (asserted); with it the same objects, attributes and greedy "
              "tokens after level-1 wakes (one call and split per tag) and a level-2 wake; 0.26.0rc1 stands down "
              "and its own wake keeps everything"),
    changes=("`NPUWorker.wake_up` (vllm-ascend 0.13.0rc1-0.25.1rc1; 0.12.0rc1's `worker_v1.py` has the same code, "
             "not hooked): after a wake that includes `weights`, every fused MoE expert Parameter (`w13_weight`, "
             "`w2_weight`) that the wake replaced by a transposed view of the same storage is put back, so the "
             "processed layout `npu_grouped_matmul` needs and the attributes on it (a trainer's `weight_loader`) "
             "survive the wake (the end state of vllm-ascend PR #13012; ms-swift 4.5+ carries the same repair for "
             "itself). The probe reads `wake_up` and stands down where the re-layout is gone (0.26.0rc1) The "
             "wrapper is `shim.vllm.moe_layout`."),
)

PATCHES = [PATCH]
