"""ms-swift's colocate wake order around ``offload_context`` (patches ``swift-resample-wake-order``,
``-3x`` and ``swift-grpo-resample-wake-order``; the why is in ``patches/swift_resample_wake_order.py``).

For one ``_fast_infer`` call that needs no weight push, with the trainer offloaded, the engine's
early ``wake_up(tags=["weights"])`` is held back and the later ``wake_up(tags=["kv_cache"])``
becomes ``wake_up(tags=["weights", "kv_cache"])`` (ms-swift 4.6.0's order). Anything it cannot
read or set keeps upstream's order.
"""
from __future__ import annotations

from shim.engine import log

_MISSING = object()
_logged = False


def _wake_tags(engine) -> bool:
    import inspect

    try:
        return "tags" in inspect.signature(engine.wake_up).parameters
    except (TypeError, ValueError):
        return False


def _defer(instance) -> "object | None":
    """The vLLM engine whose weights wake this ``_fast_infer`` call should move after the offload, or None
    (upstream's order is kept). The same conditions as 4.6.0's ``colocate_sleeping and not
    needs_weight_sync``, plus: the trainer is offloaded (otherwise the order changes nothing) and both
    tags are asleep."""
    train_args = instance.args
    if instance.vllm_mode != "colocate" or not getattr(train_args, "sleep_level", 0) > 0:
        return None
    if not getattr(instance, "enable_offload", False):
        return None
    if train_args.sleep_level == 2 or instance.state.global_step != instance._last_loaded_step:
        return None  # a push follows: the weights must be awake while the trainer is still on the device
    executor = instance.engine.inner_model_executor
    if not executor.is_sleeping:
        return None
    asleep = getattr(executor, "sleeping_tags", None)
    if asleep is not None and not {"weights", "kv_cache"} <= set(asleep):
        return None
    engine = instance.engine.engine
    return engine if _wake_tags(engine) else None


def fast_infer(wrapped, instance, args, kwargs):
    """The ``_fast_infer`` wrapper: the early weights wake held back for this call where :func:`_defer` says."""
    global _logged
    try:
        engine = _defer(instance)
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

    try:
        own = vars(engine).get("wake_up", _MISSING)
        engine.wake_up = wake_up
    except Exception as exc:  # an engine that takes no attribute (no __dict__, a proxy): upstream's order
        log.debug(f"swift-resample-wake-order: upstream order kept ({type(exc).__name__}: {exc})")
        return wrapped(*args, **kwargs)
    try:
        result = wrapped(*args, **kwargs)
    finally:
        if own is _MISSING:
            vars(engine).pop("wake_up", None)
        else:
            engine.wake_up = own
    if held == [True, False]:
        log.event("swift-resample-wake-order: same-step rollout without a weight push: vLLM's weights woken "
                  "with the KV cache after offload_context (as ms-swift 4.6.0)", important=not _logged)
        _logged = True
    return result
