"""ms-swift's LoRA weight push moves the frozen base model by a rounding at every sync.

Upstream: none reported (found here; open in every ms-swift release up to 4.6.0)
Affects:  ms-swift >=3.10.0 with --tuner_type lora (3.x: --train_type lora) and vLLM (colocate and server
          mode), bf16/fp16 base weights: >=4.0.0 and >=3.10.0,<4.0.0 (3.2-3.9 push from GRPOTrainer: not covered)
Remove:   when the shim's minimum supported ms-swift pushes LoRA weights without writing the base

Each push calls ``model.merge_adapter()`` (PEFT adds the LoRA delta into the base weight in place), reads the
base tensors, and ``model.unmerge_adapter()`` subtracts it again; in bfloat16 ``(W + dW) - dW != W``, so the
frozen base random-walks with every sync (ms-swift's own FSDP2 path merges out of place,
``_merge_lora_into_state_dict``, because "unmerge fails to properly restore original weights" there).
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, missing, source

_METHODS = ("_move_model_to_vllm", "_move_full_model_to_vllm", "_load_state_dict_to_vllm")


def probe(module):
    cls = getattr(module, "RolloutTrainerMixin", None)
    reason = missing(cls, _METHODS, "RolloutTrainerMixin")
    if reason:
        return reason
    text, reason = source(cls._move_full_model_to_vllm, "RolloutTrainerMixin._move_full_model_to_vllm")
    if reason:
        return reason
    if "._load_state_dict_to_vllm(" not in text:
        return changed("_move_full_model_to_vllm does not push through _load_state_dict_to_vllm")
    if ".merge_adapter()" not in text or ".unmerge_adapter()" not in text:
        return "upstream merges out of place (_move_full_model_to_vllm calls no merge_adapter/unmerge_adapter)"
    return None


def apply(module, patcher):
    from shim.swift import lora_merge

    patcher.wrap(module.RolloutTrainerMixin, "_move_model_to_vllm", lora_merge.move_model_to_vllm(patcher.patch_id))


PATCH = Patch(
    id="swift-lora-merge-drift",
    kind="fix",
    tested_at=("swift", "4.6.0"),
    issue="ms-swift LoRA merge drift",
    distribution="ms-swift",
    affected=">=4.0.0",
    module="swift.rlhf_trainers.rollout_mixin",
    apply=apply,
    probe=probe,
    summary="LoRA weight push (full push with the adapter merged, and the adapter push): merged out of place per "
            "tensor as _load_state_dict_to_vllm reads it, so the frozen base keeps its bytes",
    verified=("CPU: real ms-swift 4.6.0 (PEFT 0.20.0) and 3.10.1 (PEFT 0.17.1) `RolloutTrainerMixin` with a LoRA "
              "on a bf16 model (`--tuner_type lora` / `--train_type lora`), level 2, 6 rollouts: without the shim "
              "the base's bytes change at the first push and keep walking (asserted), with it unchanged and the "
              "engine within one bf16 rounding of base + adapter (`Linear` and `Embedding`); 4.6.0 "
              "`--vllm_enable_lora true` at level 1 (adapter pushes): base moves without the shim (asserted), "
              "unchanged with it"),
    changes=("`RolloutTrainerMixin._move_model_to_vllm` (4.x `swift.rlhf_trainers`, 3.10-3.12 "
             "`swift.trainers.rlhf_trainer`) for a `peft.PeftModel`: the model's `merge_adapter`/`unmerge_adapter` "
             "write nothing during the push; the full push (`_move_full_model_to_vllm`, vLLM's LoRA off) hands "
             "`_load_state_dict_to_vllm` a view of each group's state dict whose LoRA base tensors are read merged "
             "out of place (the layer's own `merge`, ms-swift's group-restricted one, on a copy), one at a time; "
             "the adapter push (vLLM's LoRA on) reads the adapter as it is. Left to upstream: FSDP2 (ms-swift "
             "merges out of place there itself), colocate on an NPU (vllm-ascend's reload runner), layers as for "
             "`trl-lora-merge-drift`. Stands down by probe where `_move_full_model_to_vllm` calls no "
             "`merge_adapter`/`unmerge_adapter`. Not covered: 3.2-3.9 (`GRPOTrainer` pushes itself). Where the "
             "merge runs: `RolloutTrainerMixin._move_full_model_to_vllm` (vLLM's LoRA off: merged into every full "
             "push) and `_move_adapter_to_vllm` (vLLM's LoRA on: merged and unmerged around the adapter push); "
             "`shim.swift.lora_merge` wraps `_move_model_to_vllm`. Not a PEFT model, FSDP2, colocate on an NPU, or "
             "layers the out-of-place path cannot reproduce: upstream's code unchanged. The 3.x rollout mixin "
             "reads `model.state_dict()` (tensors sharing the parameters' storage) in the same shape."),
)
PATCH_3X = PATCH.like(
    id="swift-lora-merge-drift-3x", affected=">=3.10.0,<4.0.0", module="swift.trainers.rlhf_trainer.rollout_mixin",
    tested_at=("swift", "3.10.1"),
    verified="CPU: real ms-swift 3.10.1 RolloutTrainerMixin (--train_type lora, bf16, PEFT 0.17.1) on the vLLM "
             "stand-in: base bytes unchanged, engine = base + adapter")

PATCHES = [PATCH, PATCH_3X]
