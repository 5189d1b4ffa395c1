"""Keep the buffers a level-2 sleep saved until the weights are woken.

vLLM's ``Worker.sleep(level=2)`` saves ``model.named_buffers()`` (rope ``cos_sin_cache``,
``inv_freq``: values no checkpoint holds, so neither ``reload_weights`` nor a trainer's push
brings them back) and ``Worker.wake_up`` restores them. Up to vLLM 0.26.x (gated on the
``weights`` tag from 0.27.0; the wheels read: 0.10.2-0.26.0 tag-blind, 0.27.0+ gated) and in
every vllm-ascend release (``NPUWorker.wake_up``, 0.23.0 and main), the restore ignores
``tags``: ``wake_up(["kv_cache"])`` after a level-2 sleep copies the buffers into the
still-unmapped weight memory (CUDA_ERROR_ILLEGAL_ADDRESS, vllm#45619; an MTE fault on NPU), and
where the copy does not fault it drops the saved copies, so the later ``wake_up(["weights"])``
leaves them undefined.

:func:`keep_buffers` (a wrapper of the worker's ``wake_up``) hides the saved buffers from a
wake that does not include ``weights`` and puts them back afterwards, so the weights wake
restores them -- whatever order the trainer wakes the tags in (TRL GOLD 0.25-0.29 wakes
``kv_cache`` first). The wake order itself is left alone (``shim.vllm.wake_plan``).
"""
from __future__ import annotations

import inspect

from shim.engine import log


def _tags(wrapped, args, kwargs):
    if "tags" in kwargs:
        return kwargs["tags"]
    try:
        return inspect.signature(wrapped).bind_partial(*args, **kwargs).arguments.get("tags")
    except (TypeError, ValueError):
        return None


def keep_buffers(wrapped, instance, args, kwargs):
    tags = _tags(wrapped, args, kwargs)
    saved = getattr(instance, "_sleep_saved_buffers", None)
    if tags is None or "weights" in tags or not saved:
        return wrapped(*args, **kwargs)
    instance._sleep_saved_buffers = {}
    log.debug(f"wake_up({list(tags)}) after a level-2 sleep: {len(saved)} saved buffers kept for the weights wake")
    try:
        return wrapped(*args, **kwargs)
    finally:
        if not getattr(instance, "_sleep_saved_buffers", None):
            instance._sleep_saved_buffers = saved


def probe_restore(cls) -> "str | None":
    """None where ``cls.wake_up`` restores the saved buffers without looking at the tags; else why not."""
    wake = vars(cls).get("wake_up")  # the class's own (vLLM's Worker, vllm-ascend's NPUWorker)
    if wake is None:
        return f"upstream shape changed ({cls.__name__} defines no wake_up)"
    try:
        source = inspect.getsource(wake)
    except (OSError, TypeError):
        return f"upstream shape changed (source of {cls.__name__}.wake_up unavailable)"
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("if") and "_sleep_saved_buffers" in text:
            if "weights" in text:
                return "fixed upstream (buffer restore waits for the weights tag)"
            return None
    return f"upstream shape changed ({cls.__name__}.wake_up restores no _sleep_saved_buffers)"
