"""ms-swift 3.10-3.11 rollouts generate from discarded weights after a level-2 sleep.

Upstream: modelscope/ms-swift, no issue filed; fixed in 3.12.0 (`or args.sleep_level == 2` in `_fast_infer`
          and in `_move_model_to_vllm`'s full-push condition)
Affects:  ms-swift >=3.10.0,<3.12.0 colocate rollouts with --sleep_level 2
Remove:   when the shim's minimum supported ms-swift is >=3.12.0

``RolloutTrainerMixin._fast_infer`` wakes the weights and pushes the trained
weights only when ``global_step != _last_loaded_step``; with LoRA it pushes
only the adapter once the base was synced. After ``sleep(level=2)`` the
weights are discarded, so a second rollout in the same step (GKD per
micro-batch, GRPO dynamic sampling, evaluation) and every LoRA rollout
generate from undefined memory. The shim does what 3.12 does: after a level-2
sleep, the next ``_fast_infer`` pushes the full weights.
"""
from shim.patching import Patch


def _fast_infer(wrapped, instance, args, kwargs):
    train_args = getattr(instance, "args", None)
    if (getattr(instance, "vllm_mode", None) == "colocate" and getattr(train_args, "sleep_level", 0) == 2
            and getattr(instance.engine.inner_model_executor, "is_sleeping", False)):
        instance._last_loaded_step = None  # never equal to global_step: the push runs
        instance.base_sync_done = False  # LoRA: the base weights were discarded too
    return wrapped(*args, **kwargs)


def probe(module):
    import inspect

    cls = getattr(module, "RolloutTrainerMixin", None)
    if cls is None or not hasattr(cls, "_fast_infer") or not hasattr(cls, "_move_model_to_vllm"):
        return "upstream shape changed: RolloutTrainerMixin._fast_infer/_move_model_to_vllm not found"
    if "sleep_level == 2" in inspect.getsource(cls._fast_infer):
        return "fixed upstream (_fast_infer pushes after sleep_level == 2)"
    return None


def apply(module, patcher):
    patcher.wrap(module.RolloutTrainerMixin, "_fast_infer", _fast_infer)


PATCH = Patch(
    id="swift-level2-resync",
    issue="ms-swift 3.10-3.11 level-2 gap",
    distribution="ms-swift",
    affected=">=3.10.0,<3.12.0",
    fixed_in="3.12.0",
    module="swift.trainers.rlhf_trainer.rollout_mixin",
    apply=apply,
    probe=probe,
    summary="RolloutTrainerMixin._fast_infer: full weight push after every level-2 sleep (as ms-swift 3.12 does)",
    verified="CPU: real ms-swift 3.10.0/3.10.1 RolloutTrainerMixin on the vLLM stand-in",
)

PATCHES = [PATCH]
