"""ms-swift 3.6-4.5.x: a same-step rollout wakes vLLM's weights before the trainer is offloaded.

Upstream: modelscope/ms-swift#10109 (PR: colocate offload and vLLM wake-up ordering), fixed in 4.6.0 (not in
          3.x); its other half, reloading only the models offload_context moved (#9793), is not this patch
Affects:  ms-swift >=4.0.0,<4.6.0, >=3.10.0,<4.0.0 (mixin) and >=3.6.0,<3.10.0 (GRPOTrainer) colocate rollouts with
          --sleep_level 1, --offload_model / --offload_optimizer and a second rollout in one training step
Remove:   when the shim's minimum supported ms-swift is >=4.6.0

The rollout wakes vLLM's weights, pushes if the step changed, and only then enters ``offload_context()``, which
moves the trainer off the device: when no push is needed the early wake buys nothing, and the trainer and vLLM's
weights sit on the device together (an OOM where both do not fit). 4.6.0 wakes them early only when it pushes.
"""
from shim.engine.patch import Patch
from shim.engine.probes import changed, method, source
from shim.swift import wake_order

_FIXED = ("needs_weight_sync", "tags.insert(0, 'weights')")
_EARLY = ("'tags': ['weights']", "wake_up(tags=['weights'])")
_LATE = "wake_up(tags=['kv_cache'])"


def _probe(cls, name: str, own: bool, rollout: str = "_fast_infer"):
    fast = method(cls, rollout, own)
    if fast is None or not hasattr(cls, "offload_context"):
        return changed(f"{name}.{rollout}/offload_context not found")
    text, reason = source(fast, f"{name}.{rollout}")
    if reason:
        return reason
    if any(marker in text for marker in _FIXED):
        return f"fixed upstream ({name}.{rollout} wakes the weights early only before a push)"
    early = min((i for i in (text.find(e) for e in _EARLY) if i >= 0), default=-1)
    context, late = text.find("with context()"), text.find(_LATE)
    if not (0 <= early < context < late) or "_last_loaded_step" not in text:
        return changed(f"{name}.{rollout} does not wake the weights before offload_context and the kv_cache "
                       "inside it")
    return None


def probe(module):
    """4.0.0-4.5.3 and 3.10.0-3.12.6 (``swift.trainers.rlhf_trainer.rollout_mixin``): the same order."""
    cls = getattr(module, "RolloutTrainerMixin", None)
    if cls is None:
        return changed("RolloutTrainerMixin not found")
    return _probe(cls, "RolloutTrainerMixin", own=False)


def probe_grpo(module):
    """3.6.0-3.9.x: ``GRPOTrainer``'s own ``_fast_infer`` (3.6-3.7 spell the early wake
    ``wake_up(tags=['weights'])``, 3.8-3.9 through ``kwargs``)."""
    cls = getattr(module, "GRPOTrainer", None)
    if cls is None:
        return changed("GRPOTrainer not found")
    return _probe(cls, "GRPOTrainer", own=True)


def probe_megatron(module):
    """4.0.0-4.5.3 ``MegatronRolloutMixin._generate_completions``: the same order."""
    cls = getattr(module, "MegatronRolloutMixin", None)
    if cls is None:
        return changed("MegatronRolloutMixin not found")
    return _probe(cls, "MegatronRolloutMixin", own=False, rollout="_generate_completions")


def apply(module, patcher):
    patcher.wrap(module.RolloutTrainerMixin, "_fast_infer", wake_order.fast_infer)


def apply_grpo(module, patcher):
    patcher.wrap(module.GRPOTrainer, "_fast_infer", wake_order.fast_infer)


PATCH = Patch(
    id="swift-resample-wake-order",
    tested_at=("swift", "4.5.3"),
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=4.0.0,<4.6.0",
    fixed_in="4.6.0",
    module="swift.rlhf_trainers.rollout_mixin",
    apply=apply,
    probe=probe,
    summary="RolloutTrainerMixin._fast_infer: a same-step rollout without a push wakes vLLM's weights after "
            "offload_context, with the KV cache (as ms-swift 4.6.0)",
    verified=("CPU: real ms-swift 4.5.3 and 3.10.1 `RolloutTrainerMixin` with the release's "
              "`GRPOTrainer.offload_context`, and 3.9.3 `GRPOTrainer`, level 1, two rollouts per step, on the "
              "stand-in (the trainer model's bytes booked on the fake device around the real `offload_model` / "
              "`load_model`): the second rollout of each step wakes the weights with the trainer on the device "
              "without the shim (asserted), after the offload with it, every rollout on the trained weights; "
              "4.6.0: the same order with and without the shim (the one the shim gives 4.5.3), nothing wrapped, "
              "the probe says fixed. The wake code is identical in 4.0.0-4.5.3 (and in 3.10.0-3.12.6 up to the "
              "level-2 push, 3.8-3.9 `GRPOTrainer`; 3.6-3.7 spell the early wake differently); the probe accepts "
              "every one of them and stands down on 4.6.0 (read in the wheels); other releases not run."),
    changes=("`RolloutTrainerMixin._fast_infer` (3.6-3.9: `GRPOTrainer._fast_infer`): a rollout that needs no "
             "weight push no longer wakes vLLM's weights before `offload_context()` has moved the trainer off the "
             "device (both there at once: OOM where they do not fit); they wake with the KV cache inside it "
             "(`wake_up(tags=[\"weights\", \"kv_cache\"])`, 4.6.0's order). Rollouts that push keep upstream's order "
             "(the push needs both); nothing changes at level 2, without offload or with an untagged `wake_up`. "
             "Stands down by range and, where `_fast_infer` decides the early wake on `needs_weight_sync` (4.6.0), "
             "by probe. Upstream, read in the wheels: `RolloutTrainerMixin._fast_infer` (4.0.0-4.5.3 and "
             "3.10.0-3.12.6; before 3.10 `GRPOTrainer._fast_infer`, from 3.6.0, where `offload_context` appeared: "
             "the same wake order in every release) wakes the weights (`wake_up(tags=[\"weights\"])`) whenever the "
             "engine sleeps, pushes the trained weights when `global_step` changed (3.11.1+: or `sleep_level == "
             "2`), then enters `offload_context()` and wakes the `kv_cache`. The shim acts for one `_fast_infer` "
             "call at a time: when the rollout needs no push and the trainer is offloaded (`enable_offload`), the "
             "early `wake_up(tags=[\"weights\"])` is held back and the later `wake_up(tags=[\"kv_cache\"])` becomes "
             "`wake_up(tags=[\"weights\", \"kv_cache\"])`."),
)


def apply_megatron(module, patcher):
    patcher.wrap(module.MegatronRolloutMixin, "_generate_completions", wake_order.generate_completions)


PATCH_MEGATRON = Patch(
    id="swift-megatron-resample-wake-order",
    tested_at=("swift-megatron", "4.5.3"),
    kind="fix",
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=4.0.0,<4.6.0",
    fixed_in="4.6.0",
    module="swift.megatron.trainers.rollout_mixin",
    apply=apply_megatron,
    probe=probe_megatron,
    summary="MegatronRolloutMixin._generate_completions: a same-step rollout without a push wakes vLLM's weights "
            "after offload_context, with the KV cache (as ms-swift 4.6.0)",
    verified=("CPU: real ms-swift 4.5.3 `MegatronGRPOTrainer` (built without `__init__`; megatron-core 0.16.1, "
              "mcore-bridge names stood in), its `_init_rollout_engine` and two `_generate_completions` per step "
              "at level 1 with `--offload_model` (the real `offload_megatron_model_to_cpu` / "
              "`load_megatron_model_to_gpu` on the trainer's parameters as device memory of the stand-in, "
              "`tests/support/residency.py`; the push through the real `_move_model_to_vllm` -> "
              "`_export_and_load_weights`, with `tests/support/mcore_bridge.HFLayoutBridge.export_weights`): the "
              "second rollout of each step wakes the weights with the trainer's bytes on the device without the "
              "shim (asserted), with the KV cache after the offload with it, every rollout on the trained weights; "
              "4.6.0 stands down by version and probe, the same order with and without the shim"),
    changes=("the wrapper of `swift-resample-wake-order` on `MegatronRolloutMixin._generate_completions` (the same "
             "order in every release 4.0.0-4.5.3, the same fix in 4.6.0; its step is `_step`). Read in the wheels: "
             "4.0.0-4.2.x wake without `aggressive_empty_cache`, 4.5.3 sleeps in a `finally`; the same probe as "
             "`swift-resample-wake-order`."),
)

PATCH_3X = Patch(
    id="swift-resample-wake-order-3x",
    tested_at=("swift", "3.10.1"),
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=3.10.0,<4.0.0",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=apply,
    probe=probe,
    summary="3.x RolloutTrainerMixin._fast_infer: the same order as 4.6.0 (no 3.x release has it)",
    changes=PATCH.changes,
    verified=PATCH.verified,
)

PATCH_GRPO = Patch(
    id="swift-grpo-resample-wake-order",
    tested_at=("swift", "3.9.3"),
    issue="modelscope/ms-swift#10109",
    distribution="ms-swift",
    affected=">=3.6.0,<3.10.0",
    module="swift.trainers.rlhf_trainer.grpo_trainer",
    apply=apply_grpo,
    probe=probe_grpo,
    summary="3.6-3.9 GRPOTrainer._fast_infer: the same order as 4.6.0 (no 3.x release has it)",
    changes=PATCH.changes,
    verified=PATCH.verified,
)

PATCHES = [PATCH, PATCH_MEGATRON, PATCH_3X, PATCH_GRPO]
