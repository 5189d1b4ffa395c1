"""ms-swift's colocate wake order around ``offload_context`` (patches ``swift-resample-wake-order``,
``-3x``, ``swift-grpo-resample-wake-order`` and ``swift-megatron-resample-wake-order``; the why is in
``patches/swift_resample_wake_order.py``).

For one rollout call (``_fast_infer``; Megatron: ``_generate_completions``) that needs no weight push,
with the trainer offloaded, the engine's early ``wake_up(tags=["weights"])`` is held back and the later
``wake_up(tags=["kv_cache"])`` becomes ``wake_up(tags=["weights", "kv_cache"])`` (ms-swift 4.6.0's
order). Anything it cannot read or set keeps upstream's order. The two rollout methods differ only in
where the trainer keeps its step: ``state.global_step`` (the HF trainers), ``_step`` (Megatron).
"""
from __future__ import annotations

from contextlib import ExitStack

from shim.engine import log
from shim.engine.shadow import shadow
from shim.vllm import engines


def _wake_tags(engine) -> bool:
    import inspect

    try:
        return "tags" in inspect.signature(engine.wake_up).parameters
    except (TypeError, ValueError):
        return False


def _defer(instance, step) -> "object | None":
    """The vLLM engine whose weights wake this rollout call should move after the offload, or None
    (upstream's order is kept). ``step``: the trainer's step for this call. The same conditions as 4.6.0's
    ``colocate_sleeping and not needs_weight_sync``, plus: the trainer is offloaded (otherwise the order
    changes nothing) and both tags are asleep."""
    train_args = instance.args
    if instance.vllm_mode != "colocate" or not getattr(train_args, "sleep_level", 0) > 0:
        return None
    if not getattr(instance, "enable_offload", False):
        return None
    if train_args.sleep_level == 2 or step(instance) != instance._last_loaded_step:
        return None  # a push follows: the weights must be awake while the trainer is still on the device
    executor = instance.engine.inner_model_executor
    if not executor.is_sleeping:
        return None
    asleep = engines.executor_tags(executor)
    if asleep is not None and not set(engines.TAGS) <= asleep:
        return None
    engine = instance.engine.engine
    return engine if _wake_tags(engine) else None


def _rollout_wrapper(step, method: str):
    """A wrapt wrapper for a rollout method: the early weights wake held back for one call where
    :func:`_defer` says. ``step(instance)``: the trainer's current step; ``method``: the wrapped method's
    name (the first held-back wake of each is an INFO line, later ones DEBUG)."""

    def rollout(wrapped, instance, args, kwargs):
        try:
            engine = _defer(instance, step)
        except Exception as exc:  # an attribute this release does not have: upstream's order
            log.debug(f"swift-resample-wake-order: upstream order kept ({type(exc).__name__}: {exc})")
            engine = None
        if engine is None:
            return wrapped(*args, **kwargs)
        original = engine.wake_up  # bound: the class's wake_up with every wrapper on it
        held = []

        def wake_up(tags=None):
            if tags is not None and list(tags) == ["weights"] and not held:
                held.append(True)  # the early wake, before offload_context: held back
                return None
            if tags is not None and list(tags) == ["kv_cache"] and held == [True]:
                held.append(False)  # inside offload_context: the trainer is off the device now
                return original(tags=["weights", "kv_cache"])
            return original(tags=tags)

        with ExitStack() as stack:
            try:
                stack.enter_context(shadow(engine, "wake_up", wake_up))
            except Exception as exc:  # an engine that takes no attribute (no __dict__, a proxy): upstream's order
                log.debug(f"swift-resample-wake-order: upstream order kept ({type(exc).__name__}: {exc})")
                return wrapped(*args, **kwargs)
            result = wrapped(*args, **kwargs)
        if held == [True, False]:
            log.event("swift-resample-wake-order: same-step rollout without a weight push: vLLM's weights woken "
                      "with the KV cache after offload_context (as ms-swift 4.6.0)", important=log.once(("swift-resample-wake-order", method)))
        return result

    return rollout


fast_infer = _rollout_wrapper(lambda t: t.state.global_step, "_fast_infer")
"""``RolloutTrainerMixin._fast_infer`` (3.10-4.5.x) and ``GRPOTrainer._fast_infer`` (3.6-3.9)."""

generate_completions = _rollout_wrapper(lambda t: t._step, "_generate_completions")
"""``MegatronRolloutMixin._generate_completions`` (4.0-4.5.x)."""
