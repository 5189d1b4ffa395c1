"""What a vLLM engine says about its sleep, and per-tag wake; shared by the sleep check
(``shim.vllm.sleep_check``) and the TRL proxy (``shim.trl.synced_llm``).

vLLM's executor (``vllm/v1/executor/abstract.py``) ignores the WHOLE
``wake_up(tags)`` call, with a warning, when any requested tag is not asleep:
``wake_up(["weights", "kv_cache"])`` after ``wake_up(["weights"])`` wakes
nothing, and the next generate runs over an unmapped KV cache. :func:`wake`
asks only for the requested tags that are asleep, skips the call when none
is, and gives cached blocks back first (gc + the device's ``empty_cache``:
re-mapped physical pages cannot reuse blocks PyTorch caches; vLLM >= 0.30 does
this itself). It never passes an empty tag list (vLLM would mark every tag
awake without mapping any).
"""
from __future__ import annotations

from shim.vllm import memory, sleep_state

TAGS = sleep_state.TAGS


def executor_of(obj):
    """The in-process executor (``LLM.llm_engine.model_executor``), or None."""
    engine = sleep_state.engine_of(obj)
    return getattr(engine, "model_executor", None)


def engine_sleep_mode(engine) -> "bool | None":
    """``enable_sleep_mode`` of a built engine (``vllm_config.model_config`` or ``model_config``)."""
    for cfg in (getattr(getattr(engine, "vllm_config", None), "model_config", None),
                getattr(engine, "model_config", None)):
        value = getattr(cfg, "enable_sleep_mode", None)
        if value is not None:
            return bool(value)
    return None


def asleep_tags(obj) -> set:
    """Tags vLLM's executor reports asleep (``sleeping_tags``), else the shim's record."""
    executor = executor_of(obj)
    tags = getattr(executor, "sleeping_tags", None)
    if isinstance(tags, (set, frozenset, list, tuple)):
        return set(tags) if getattr(executor, "is_sleeping", bool(tags)) else set()
    return set(sleep_state.state_for(obj).asleep)


def plan(obj, tags) -> "tuple[bool, object, list]":
    """``(call, tags_to_pass, woken)``: whether to call vLLM's wake_up, with which tags,
    and which tags that wakes. ``tags=None`` (everything) is passed as None."""
    asleep = asleep_tags(obj)
    extra = [t for t in (tags or ()) if t not in TAGS]  # e.g. "scheduling" (vLLM >= 0.18)
    requested = list(TAGS) if tags is None else [t for t in tags if t in TAGS]
    todo = [t for t in requested if t in asleep]
    if tags is None:
        return True, None, sorted(asleep)
    if not todo:
        return bool(extra), (extra or None), []
    if set(todo) == set(requested) and not extra:
        return True, list(tags), todo
    return True, todo + extra, todo


def wake(obj, tags, call, release: bool = True):
    """Wake ``tags`` of ``obj`` through ``call(tags)`` (vLLM's wake_up), per tag.

    Returns ``(result, woken_tags, called)``.
    """
    do_call, pass_tags, woken = plan(obj, tags)
    if not do_call:
        return None, [], False
    if release and woken:
        memory.release_cached()
    result = call(pass_tags)
    sleep_state.note_wake(obj, woken if tags is not None else None)
    return result, woken, True
