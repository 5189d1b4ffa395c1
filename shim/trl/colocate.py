"""Binds ``shim.trl.synced_llm`` to a TRL class that keeps a colocated ``llm``.

TRL 0.25-0.27 GRPO/RLOO, the experimental OnlineDPO (0.28+) and ``VLLMGeneration`` (0.28+) share one shape:
a push method (``_move_model_to_vllm``) that writes the trainer's weights into ``self.llm``, and a generate
method that wakes the engine, pushes only when ``global_step`` changed, generates, and sleeps at level 2.
ms-swift's subclasses are never touched. Module import cost: nothing but this file; ``shim.trl.synced_llm``
is imported when a wrapper first runs.
"""
from __future__ import annotations

from shim.engine.probes import changed


def trainer_colocate(trainer) -> bool:
    """A trainer with its own colocated ``llm``: ``args.use_vllm`` and ``vllm_mode``."""
    args = getattr(trainer, "args", None)
    return bool(getattr(args, "use_vllm", False)) and getattr(trainer, "vllm_mode", None) == "colocate"


def trainer_colocate_sleep(trainer) -> bool:
    """... with ``args.vllm_enable_sleep_mode``."""
    return trainer_colocate(trainer) and bool(getattr(trainer.args, "vllm_enable_sleep_mode", False))


def generation_colocate(gen) -> bool:
    """``VLLMGeneration`` (0.28+) in colocate ``mode``."""
    return getattr(gen, "mode", None) == "colocate"


def generation_colocate_sleep(gen) -> bool:
    """... with ``enable_sleep_mode``."""
    return generation_colocate(gen) and bool(getattr(gen, "enable_sleep_mode", False))


def gold_colocate(trainer) -> bool:
    """GOLD 0.25-0.29: ``use_vllm`` and ``vllm_mode`` on the trainer itself."""
    return bool(getattr(trainer, "use_vllm", False)) and getattr(trainer, "vllm_mode", None) == "colocate"


def gold_colocate_sleep(trainer) -> bool:
    """... with ``vllm_enable_sleep_mode`` on the trainer."""
    return gold_colocate(trainer) and bool(getattr(trainer, "vllm_enable_sleep_mode", False))


class _Site:
    """Where one class keeps its engine and how it pushes: ``obj.<llm_attr>`` becomes a ``SyncedLLM``."""

    def __init__(self, push_name, predicate, llm_attr):
        self.push_name, self.predicate, self.llm_attr = push_name, predicate, llm_attr

    def synced(self, obj):
        """The synced engine of ``obj``, attached on first use; None where the patch does not act."""
        from shim.trl import synced_llm

        llm = getattr(obj, self.llm_attr, None)
        if llm is None or not self.predicate(obj) or synced_llm.owned_by_swift(obj):
            return None
        llm = synced_llm.attach(llm, push=getattr(obj, self.push_name))
        setattr(obj, self.llm_attr, llm)
        return llm

    def push(self, wrapped, instance, args, kwargs):
        llm = self.synced(instance)
        if llm is None:
            return wrapped(*args, **kwargs)
        from shim.trl import synced_llm

        llm.wake_up(tags=["weights"])  # never write into unmapped memory
        result = wrapped(*args, **kwargs)
        synced_llm.after_push(llm)
        return result

    def generate(self, wrapped, instance, args, kwargs):
        self.synced(instance)
        return wrapped(*args, **kwargs)


def binding(class_name: str, generate_name: str, push_name: str = "_move_model_to_vllm",
            predicate=trainer_colocate_sleep, llm_attr: str = "llm"):
    """(probe, apply) for a Patch on ``class_name`` in its module.

    The binding wraps both: the generate method attaches the synced proxy to ``self.llm`` (push = the
    trainer's own push method), the push method wakes the weights before writing and records the push.
    """

    def probe(module):
        cls = getattr(module, class_name, None)
        if cls is None or not all(hasattr(cls, m) for m in (push_name, generate_name)):
            return changed(f"{class_name}.{push_name}/{generate_name} not found")
        return None

    def apply(module, patcher):
        cls = getattr(module, class_name)
        site = _Site(push_name, predicate, llm_attr)
        patcher.wrap(cls, push_name, site.push)
        patcher.wrap(cls, generate_name, site.generate)

    return probe, apply
