"""TRL 0.25-0.27 GRPO/RLOO generate from discarded or initial weights after a level-2 sleep.

Upstream: huggingface/trl (no issue filed; the code path was replaced by VLLMGeneration in 0.28.0,
          which has #5312 instead)
Affects:  trl >=0.25.0,<0.28.0 GRPOTrainer and RLOOTrainer with vllm_mode="colocate",
          vllm_enable_sleep_mode=True
Remove:   when the shim's minimum supported trl is >=0.28.0

``_generate_single_turn`` wakes the weights after a ``sleep(level=2)`` and
pushes the trained weights only when ``global_step != _last_loaded_step``. A
second generation in the same step (tool-call loop, evaluation then training,
several generation batches per step) samples from discarded memory (0.25.x)
or from the checkpoint on disk that ``collective_rpc("reload_weights")``
brought back (0.26-0.27). The shim holds the trainer's ``llm`` behind
``shim.guarded_llm``: no reload from disk, and ``_move_model_to_vllm`` runs
before any generate whose weights are not the trainer's.
"""
from shim.patching import Patch


def _colocate_sleep(trainer) -> bool:
    from shim import guarded_llm

    args = getattr(trainer, "args", None)
    return (bool(getattr(trainer, "use_vllm", False)) and getattr(trainer, "vllm_mode", None) == "colocate"
            and bool(getattr(args, "vllm_enable_sleep_mode", False)) and getattr(trainer, "llm", None) is not None
            and not guarded_llm.owned_by_swift(trainer))


def _guard(trainer) -> None:
    from shim import guarded_llm

    trainer.llm = guarded_llm.guard(trainer.llm, push=trainer._move_model_to_vllm)


def _move_model_to_vllm(wrapped, instance, args, kwargs):
    from shim import guarded_llm

    if not _colocate_sleep(instance):
        return wrapped(*args, **kwargs)
    _guard(instance)
    instance.llm.wake_up(tags=["weights"])  # never write into unmapped memory
    result = wrapped(*args, **kwargs)
    guarded_llm.after_push(instance.llm)
    return result


def _generate_single_turn(wrapped, instance, args, kwargs):
    if _colocate_sleep(instance):
        _guard(instance)
    return wrapped(*args, **kwargs)


def _binder(class_name):
    def probe(module):
        cls = getattr(module, class_name, None)
        if cls is None or not all(hasattr(cls, m) for m in ("_move_model_to_vllm", "_generate_single_turn")):
            return f"upstream shape changed: {class_name}._move_model_to_vllm/_generate_single_turn not found"
        return None

    def apply(module, patcher):
        cls = getattr(module, class_name)
        patcher.wrap(cls, "_move_model_to_vllm", _move_model_to_vllm)
        patcher.wrap(cls, "_generate_single_turn", _generate_single_turn)

    return probe, apply


def _patch(patch_id, module, class_name):
    probe, apply = _binder(class_name)
    return Patch(
        id=patch_id,
        issue="trl level-2 resync (0.25-0.27)",
        distribution="trl",
        affected=">=0.25.0,<0.28.0",
        fixed_in="0.28.0",
        module=module,
        apply=apply,
        probe=probe,
        summary=f"{class_name} colocate+sleep: push trained weights before every generate after a level-2 sleep; "
                "no reload_weights from disk",
        verified=f"CPU: real TRL 0.25.1/0.26.2/0.27.2 {class_name} on the vLLM stand-in",
    )


GRPO = _patch("trl-grpo-level2-resync", "trl.trainer.grpo_trainer", "GRPOTrainer")
RLOO = _patch("trl-rloo-level2-resync", "trl.trainer.rloo_trainer", "RLOOTrainer")
