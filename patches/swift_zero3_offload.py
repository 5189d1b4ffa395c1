"""ms-swift 3.x ``--offload_model`` under ZeRO-3 frees nothing: DeepSpeed's partitions stay on the device.

Upstream: modelscope/ms-swift#7801 (bug), fixed by PR #7802 in 4.0.0 and, with the same code, in 3.12.3
Affects:  ms-swift >=3.5.1,<3.12.3 with --deepspeed zero3 and --offload_model true (or GKD's
          --offload_teacher_model) (3.5.1-3.9.x: GRPOTrainer.offload_model/load_model;
          3.10.0-3.12.2: RolloutTrainerMixin.offload_model/load_model, GRPO and GKD)
Remove:   when the shim's minimum supported ms-swift is >=3.12.3

``offload_model`` moves every ``param.data`` to the CPU, but under ZeRO-3 that is an empty tensor: the rank's
share is the partition ``param.ds_tensor``, which stays on the device. The offload around vLLM's construction
frees ~0 bytes of the model and vLLM's start-up check (free memory >= ``gpu_memory_utilization`` x total)
fails, or the KV cache gets less than planned.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, method, params, source
from shim.swift import zero3_offload

_FIXED = "ds_tensor"


def _probe(module, cls, name: str, own: bool):
    methods = {}
    for attr in ("offload_model", "load_model"):
        func = method(cls, attr, own)
        if func is None:
            return changed(f"{name}.{attr} not found")
        text, reason = source(func, f"{name}.{attr}")
        if reason:
            return reason
        names, reason = params(func, f"{name}.{attr}")
        if reason:
            return reason
        methods[attr] = (text, names)
    if any(_FIXED in text for text, _ in methods.values()):
        return f"fixed upstream ({name}.offload_model moves ds_tensor)"
    for attr, (text, names) in methods.items():
        if names != ["self", "model"] or "param.data" not in text:
            return changed(f"{name}.{attr}(self, model) does not move param.data")
    if "get_current_device" not in methods["load_model"][0] or not callable(getattr(module, "get_current_device",
                                                                                    None)):
        return changed(f"{name}.load_model does not use get_current_device")
    return None


def probe(module):
    cls = getattr(module, "RolloutTrainerMixin", None)
    if cls is None:
        return changed("RolloutTrainerMixin not found")
    return _probe(module, cls, "RolloutTrainerMixin", own=False)


def probe_grpo(module):
    cls = getattr(module, "GRPOTrainer", None)
    if cls is None:
        return changed("GRPOTrainer not found")
    return _probe(module, cls, "GRPOTrainer", own=True)


def _apply_to(cls_name):
    def apply(module, patcher):
        cls = getattr(module, cls_name)
        offload_model, load_model = zero3_offload.wrappers(lambda: module.get_current_device())  # looked up per call
        patcher.wrap(cls, "offload_model", offload_model)
        patcher.wrap(cls, "load_model", load_model)

    return apply


_COMMON = dict(
    issue="modelscope/ms-swift#7801",
    distribution="ms-swift",
    summary="offload_model/load_model also move each ZeRO-3 partition (param.ds_tensor) to the CPU and back "
            "(as ms-swift 4.0.0 / 3.12.3 do), so --offload_model frees the model before vLLM starts",
)

PATCH = Patch(
    id="swift-zero3-offload",
    tested_at=("swift", "3.10.1"),
    affected=">=3.10.0,<3.12.3",
    fixed_in="3.12.3",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=_apply_to("RolloutTrainerMixin"),
    probe=probe,
    **_COMMON,
    verified=("CPU: real ms-swift 3.10.1 and 3.9.3 `GRPOTrainer` vLLM construction (`offload_context`, engine "
              "build, first sleep) with the model loaded under ZeRO-3 by deepspeed 0.19.8 (CPU build), its "
              "partitions device memory of the stand-in's GPU (`tests/support/residency.py`, half of it), "
              "`vllm_gpu_memory_utilization=0.6`: without the shim every partition byte is still on the device at "
              "the build and vLLM's start-up check fails (asserted, 3.10.1); with it 0 bytes at the build, the "
              "engine starts, all partitions back on the device afterwards with identical values; once the "
              "DeepSpeed engine (ZeRO-3 optimizer, SGD) exists, the offload around a rollout leaves the device as "
              "it was (4.0.0's copy would hold the partitions twice). 3.12.3 (upstream's fix): the probe alone "
              "(range widened) stands it down, nothing wrapped; upstream's fix passes the same observation, and "
              "holds the partitions twice after the rollout offload (asserted)"),
    changes=("`offload_model` / `load_model`: after ms-swift's own loop (which moves only `param.data`, an empty "
             "tensor under ZeRO-3), each ZeRO-3 partition (`param.ds_tensor`) goes to the CPU (then `empty_cache`) "
             "and back to ms-swift's `get_current_device()` on load, as 4.0.0 / 3.12.3 do. Without it the offload "
             "around vLLM's construction frees ~0 bytes of the model and vLLM's start-up check fails (or the KV "
             "cache shrinks). Stands down by probe where `offload_model` already moves `ds_tensor`; models without "
             "ZeRO-3 parameters and FSDP2 are left to ms-swift. Limit (4.0.0's too): once DeepSpeed's ZeRO-3 "
             "optimizer exists, the trained model's partitions are views of its flat buffer, which keeps the "
             "memory; reference model, GKD teacher and the model at vLLM's construction are freed. Two differences "
             "from 4.0.0, both for partitions whose move would free nothing: a partition already on the host "
             "(ZeRO-3 `offload_param`) stays where DeepSpeed keeps it (4.0.0 would load it onto the GPU), and a "
             "partition that is a view into the ZeRO-3 optimizer's flat `lp_param_buffer` is not copied: the copy "
             "that 4.0.0's `load_model` makes would hold the partitions a second time on the device until the next "
             "optimizer step re-points them into the buffer (read in deepspeed 0.19.8 `stage3.py` "
             "`_create_fp16_partitions_with_defragmentation` / `_unflatten_partitioned_parameters`, and run on its "
             "CPU build). At load each partition the shim moved goes back to the device ms-swift's `load_model` "
             "uses (its module's `get_current_device`). 3.2.1-3.5.0 have the same gap in another shape "
             "(`offload_model(self)` moves modules with `module.to('cpu')`): not patched (out of range)."),
)

PATCH_GRPO = Patch(
    id="swift-grpo-zero3-offload",
    tested_at=("swift", "3.9.3"),
    affected=">=3.5.1,<3.10.0",
    module="swift.trainers.rlhf_trainer.grpo_trainer",
    apply=_apply_to("GRPOTrainer"),
    probe=probe_grpo,
    **_COMMON,
    changes=PATCH.changes,
    verified=PATCH.verified,
)

PATCHES = [PATCH, PATCH_GRPO]
