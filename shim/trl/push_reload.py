"""Binds ``shim.vllm.weights.reload.session`` to TRL's colocated push methods.

TRL pushes the trainer's weights into a colocated engine one tensor at a time with the raw
``llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights([(name, param)])``:
``VLLMGeneration.sync_weights`` (0.28.0-1.16.0), ``OnlineDPOTrainer._move_model_to_vllm``
(``trl.trainer.online_dpo_trainer`` up to 0.25, ``trl.experimental.online_dpo`` from 0.26) and the
0.x trainers' ``_move_model_to_vllm`` (GRPO, RLOO 0.23-0.27), FSDP helpers included. The wrapper puts
the whole push -- one call of that method -- inside one reload session of the trainer's ``llm``
(``self.llm``, the shim's synced proxy included), in colocate mode only; server mode and
ms-swift's subclasses are left alone (ms-swift re-processes its pushes itself:
``finish_vllm_weight_reload``).
"""
from __future__ import annotations

from shim.engine import probes
from shim.engine.probes import changed


def _raw_push(cls) -> "str | None":
    """None where ``cls`` pushes with a raw ``model.load_weights``; else why the patch stands down."""
    source, reason = probes.source(cls, cls.__name__)
    if reason:
        return reason
    if any(marker in source for marker in ("initialize_layerwise_reload", "reload_weights(weights_iterator",
                                           "start_weight_update")):
        return f"fixed upstream ({cls.__name__} pushes through vLLM's reload)"
    if ".load_weights(" not in source:
        return changed(f"{cls.__name__} has no model.load_weights push")
    return None


def binding(class_name: str, push_name: str, predicate):
    """``(probe, apply)`` for a Patch on ``class_name.push_name`` in its module."""

    def probe(module):
        cls = getattr(module, class_name, None)
        if cls is None or not callable(getattr(cls, push_name, None)):
            return changed(f"{class_name}.{push_name} not found")
        return _raw_push(cls)

    def push(wrapped, instance, args, kwargs):
        from shim.trl import synced_llm

        llm = getattr(instance, "llm", None)
        if llm is None or not predicate(instance) or synced_llm.owned_by_swift(instance):
            return wrapped(*args, **kwargs)
        from shim.vllm.weights import reload

        with reload.session(llm):
            return wrapped(*args, **kwargs)

    def apply(module, patcher):
        patcher.wrap(getattr(module, class_name), push_name, push)

    return probe, apply
