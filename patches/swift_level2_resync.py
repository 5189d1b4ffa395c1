"""ms-swift 3.2.1-3.12 rollouts generate from discarded weights (or without the adapter) after a level-2 sleep.

Upstream: modelscope/ms-swift, no issue filed; fixed by PR #7017 in 3.12.0, cherry-picked to 3.11.1; with vLLM
          LoRA, 3.12.0 merges the adapter into every full push (4.0.2: pushes it after)
Affects:  ms-swift >=3.2.1,<3.11.1 colocate rollouts with --sleep_level 2 (GRPOTrainer to 3.10.0, then the mixin);
          with --vllm_enable_lora >=3.11.1,<3.12.0
Remove:   each record when the shim's minimum supported ms-swift is past its range

After ``sleep(level=2)`` the weights are discarded, but ``_fast_infer`` pushes only when ``global_step`` changed
(3.10-3.11.0 with vLLM LoRA: only the adapter once the base was synced), and 3.11.1's full push leaves vLLM's
adapter out: a second rollout in one step and every LoRA rollout run on undefined memory or without the adapter.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, method, source
from shim.swift.level2_resync import fast_infer, move_full_model_to_vllm

_FIXED = "sleep_level == 2"


def _probe(cls, name: str, own: bool):
    fast = method(cls, "_fast_infer", own)
    if fast is None or not any(hasattr(cls, m) for m in ("_move_model_to_vllm", "_move_model_to_vllm_lmdeploy")):
        return changed(f"{name}._fast_infer/_move_model_to_vllm not found")
    text, reason = source(fast, f"{name}._fast_infer")
    if reason:
        return reason
    if "_last_loaded_step" not in text:
        return changed(f"{name}._fast_infer does not gate the push on _last_loaded_step")
    if _FIXED in text:
        return f"fixed upstream ({name}._fast_infer pushes after sleep_level == 2)"
    return None


def probe(module):
    cls = getattr(module, "RolloutTrainerMixin", None)
    if cls is None:
        return changed("RolloutTrainerMixin not found")
    if not all(hasattr(cls, m) for m in ("_move_full_model_to_vllm", "_move_adapter_to_vllm")):
        return changed("RolloutTrainerMixin._move_full_model_to_vllm/_move_adapter_to_vllm not found")
    return _probe(cls, "RolloutTrainerMixin", own=False)


def probe_lora(module):
    cls = getattr(module, "RolloutTrainerMixin", None)
    names = ("_move_model_to_vllm", "_move_full_model_to_vllm", "_move_adapter_to_vllm")
    if cls is None or not all(hasattr(cls, m) for m in names):
        return changed("RolloutTrainerMixin._move_model_to_vllm/_move_full_model_to_vllm/"
                       "_move_adapter_to_vllm not found")
    full, reason = source(cls._move_full_model_to_vllm, "RolloutTrainerMixin._move_full_model_to_vllm")
    if reason:
        return reason
    move, reason = source(cls._move_model_to_vllm, "RolloutTrainerMixin._move_model_to_vllm")
    if reason:
        return reason
    if "_move_adapter_to_vllm" in full or "should_merge_adapter" not in full:
        return "fixed upstream (RolloutTrainerMixin._move_full_model_to_vllm merges or pushes the adapter)"
    if _FIXED not in move:
        return changed("_move_model_to_vllm does not push the full model after sleep_level == 2")
    return None


def apply_lora(module, patcher):
    patcher.wrap(module.RolloutTrainerMixin, "_move_full_model_to_vllm", move_full_model_to_vllm)


def probe_grpo(module):
    cls = getattr(module, "GRPOTrainer", None)
    if cls is None:
        return changed("GRPOTrainer not found")
    return _probe(cls, "GRPOTrainer", own=True)  # its own _fast_infer, not the 3.10+ mixin's


def apply(module, patcher):
    patcher.wrap(module.RolloutTrainerMixin, "_fast_infer", fast_infer)
    patcher.wrap(module.RolloutTrainerMixin, "_move_full_model_to_vllm", move_full_model_to_vllm)


def apply_grpo(module, patcher):
    patcher.wrap(module.GRPOTrainer, "_fast_infer", fast_infer)


PATCH = Patch(
    id="swift-level2-resync",
    tested_at=("swift", "3.10.1"),
    issue="ms-swift 3.10-3.11.0 level-2 gap",
    distribution="ms-swift",
    affected=">=3.10.0,<3.11.1",
    fixed_in="3.11.1",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=apply,
    probe=probe,
    summary="RolloutTrainerMixin._fast_infer: full weight push after every level-2 sleep (as ms-swift 3.11.1 does), "
            "with vLLM LoRA the adapter too (as 4.x does)",
    verified=("CPU: real ms-swift 3.10.1 `RolloutTrainerMixin` (3.10.0's differs only in server-mode tool parsing; "
              "`SWIFT_LEVEL2_ALL=1` runs it too) (`_prepare_vllm`, then `_fast_infer` cycles) on the stand-in: "
              "discarded weights without the shim (asserted), trained weights with it; 3.11.1 and 4.6.0 correct "
              "without the shim, nothing wrapped; on 3.11.1 the probe alone (range widened) stands it down with "
              "nothing wrapped. LoRA (`--train_type lora --vllm_enable_lora true`, 3.10.1, the stand-in's vLLM "
              "0.10.2 LoRA layers and adapter manager driven by ms-swift's `patch_vllm_load_adapter` / "
              "`add_lora`): without the shim the rollouts after the first step run the new adapter on discarded "
              "base weights (asserted), with it every generate computes with the trainer's merged weights (base + "
              "adapter, within 1e-6). 3.11.1-3.11.3 with LoRA: `swift-level2-lora-adapter`"),
    changes=("`RolloutTrainerMixin._fast_infer`: after a level-2 sleep the next rollout pushes the full weights "
             "(as 3.11.1/3.12 do), also within one step (GKD per micro-batch, dynamic sampling, eval); with LoRA "
             "applied by vLLM (`--vllm_enable_lora true`, where 3.10.x pushes only the adapter once the base was "
             "synced) the base weights and then the adapter, as 4.x does; stands down by range and, where "
             "`_fast_infer` already pushes after `sleep_level == 2`, by probe Upstream's fix (PR #7017): `or "
             "args.sleep_level == 2` in `_fast_infer` and in `_move_model_to_vllm`'s full-push condition. Colocate "
             "`sleep_level` first appears in 3.2.1 (3.2.0 has none), inside `GRPOTrainer._fast_infer` "
             "(3.2.1-3.9.x: `swift-grpo-level2-resync`); 3.10.0 moved it to the rollout mixin (3.10.0-3.11.0: this "
             "record). With vLLM LoRA the full push writes the base weights only, unmerged, and the level-2 sleep "
             "discarded the adapter's GPU slots with them: the adapter is pushed too (`_move_adapter_to_vllm`), as "
             "4.x's `_move_full_model_to_vllm` does."),
)

PATCH_GRPO = Patch(
    id="swift-grpo-level2-resync",
    tested_at=("swift", "3.9.3"),
    issue="ms-swift 3.2.1-3.9 level-2 gap",
    distribution="ms-swift",
    affected=">=3.2.1,<3.10.0",
    module="swift.trainers.rlhf_trainer.grpo_trainer",
    apply=apply_grpo,
    probe=probe_grpo,
    summary="GRPOTrainer._fast_infer: full weight push after every level-2 sleep (as ms-swift 3.11.1 does)",
    changes="`GRPOTrainer._fast_infer`: the same full push after a level-2 sleep",
    verified=("CPU: real ms-swift 3.9.3 `GRPOTrainer` (`prepare_vllm` + first sleep as `__init__` does, then "
              "`_fast_infer` cycles) on the stand-in: discarded weights without the shim (asserted), trained "
              "weights with it. 3.2.1-3.8.x (older transformers/trl pins) not run"),
)

PATCH_LORA = Patch(
    id="swift-level2-lora-adapter",
    tested_at=("swift", "3.11.1"),
    issue="ms-swift 3.11.1-3.12 level-2 LoRA gap",
    distribution="ms-swift",
    affected=">=3.11.1,<3.12.0",
    fixed_in="3.12.0",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=apply_lora,
    probe=probe_lora,
    summary="RolloutTrainerMixin._move_full_model_to_vllm: with vLLM LoRA at level 2, the trainer's adapter "
            "pushed after the base weights (as ms-swift 4.0.2+ does)",
    verified=("CPU: real ms-swift 3.11.1 on the stand-in's vLLM LoRA layers: the step-1 rollouts run with no "
              "adapter without the shim (asserted), with the trained adapter and the trainer's merged weights with "
              "it; 3.12.3 stands down by probe (range widened). 4.0.0-4.0.1 (`swift.rlhf_trainers`) merge the "
              "adapter too: correct"),
    changes=("`RolloutTrainerMixin._move_full_model_to_vllm`: every level-2 sync is a full push of the base "
             "weights only (the adapter is merged only when `should_merge_adapter`, False with vLLM LoRA) and the "
             "adapter is never pushed: the shim pushes the trainer's adapter after it (`_move_adapter_to_vllm`); "
             "stands down by range and, where the full push merges or pushes the adapter itself, by probe "
             "Upstream, read in the wheels: 3.11.1-3.11.3 push the full model at every level-2 sync "
             "(`_move_model_to_vllm`: `... or args.sleep_level == 2`), with vLLM LoRA the base weights only "
             "(`_move_full_model_to_vllm` merges the adapter only `if should_merge_adapter`), and never the "
             "adapter: every rollout after the first sync runs without the trained adapter; 3.12.0 merges the "
             "adapter into every full push, 4.0.2 pushes it after one."),
)

PATCHES = [PATCH, PATCH_GRPO, PATCH_LORA]
