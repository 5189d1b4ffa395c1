"""ms-swift 3.6-4.5.x: a same-step rollout wakes vLLM's weights before the trainer is offloaded.

Upstream: modelscope/ms-swift#10109 (PR: colocate offload and vLLM wake-up ordering), fixed in 4.6.0 (not in
          3.x); its other half, reloading only the models offload_context moved (#9793), is not this patch
Affects:  ms-swift >=4.0.0,<4.6.0 (swift.rlhf_trainers; swift.megatron.trainers.rollout_mixin), >=3.10.0,<4.0.0
          (swift.trainers.rlhf_trainer rollout mixin, 3.12.6 included) and >=3.6.0,<3.10.0 (GRPOTrainer) colocate
          rollouts with --sleep_level 1 and
          --offload_model / --offload_optimizer, a second rollout in one training step (GRPO dynamic sampling,
          GKD per micro-batch, evaluation)
Remove:   when the shim's minimum supported ms-swift is >=4.6.0

``RolloutTrainerMixin._fast_infer`` (4.0.0-4.5.3 and 3.10.0-3.12.6; before 3.10 ``GRPOTrainer._fast_infer``,
from 3.6.0, where ``offload_context`` appeared: the same wake order in every release) wakes the
weights (``wake_up(tags=["weights"])``) whenever the engine sleeps, pushes the trained weights when
``global_step`` changed (3.11.1+: or ``sleep_level == 2``), and only then enters ``offload_context()``, which
moves the trainer's model and optimizer off the device, and wakes the ``kv_cache``. When no push is
needed (a second rollout in the same step at level 1), the early weights wake buys nothing: the
trainer and vLLM's weights sit on the device together, an OOM where both do not fit. 4.6.0 wakes the
weights early only when it pushes, otherwise together with the KV cache inside ``offload_context``
(``tags = ["weights", "kv_cache"]``). The shim does the same, for one ``_fast_infer`` call at a time:
when the rollout needs no push and the trainer is offloaded (``enable_offload``), the early
``wake_up(tags=["weights"])`` is held back and the later ``wake_up(tags=["kv_cache"])`` becomes
``wake_up(tags=["weights", "kv_cache"])``. Every other rollout runs as upstream wrote it. A
``wake_up`` without ``tags`` (vLLM before tagged wakes) is left alone. Stands down by probe where
``_fast_infer`` already decides the wake on ``needs_weight_sync`` (4.6.0).

The Megatron mixin (``MegatronRolloutMixin._generate_completions``, ``swift megatron rlhf``) has the same
order in every release 4.0.0-4.5.3 (read in the wheels: 4.0.0-4.2.x wake without ``aggressive_empty_cache``,
4.5.3 sleeps in a ``finally``) and 4.6.0's fix; it keeps its step in ``_step`` instead of
``state.global_step``. Record ``swift-megatron-resample-wake-order``, the same wrapper and probe.
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
    verified="CPU: real ms-swift 4.5.3 RolloutTrainerMixin + GRPOTrainer.offload_context on the vLLM stand-in; "
             "4.6.0 stands down",
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
    verified="CPU: real ms-swift 4.5.3 MegatronRolloutMixin (MegatronGRPOTrainer, offload_context, the weight push "
             "through an HF-layout bridge) on the vLLM stand-in; 4.6.0 stands down",
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
    verified="CPU: real ms-swift 3.10.1 RolloutTrainerMixin + GRPOTrainer.offload_context on the vLLM stand-in",
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
    verified="CPU: real ms-swift 3.9.3 GRPOTrainer on the vLLM stand-in",
)

PATCHES = [PATCH, PATCH_MEGATRON, PATCH_3X, PATCH_GRPO]
