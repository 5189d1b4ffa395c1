"""What a vLLM engine says about its sleep, and per-tag wake; shared by the sleep check (``SleepState.wake``),
the engine core's (``core_wake``) and the TRL proxy's (``SleepState.wake_tags``).

vLLM's executor (``vllm/v1/executor/abstract.py``) ignores the WHOLE ``wake_up(tags)`` call, with a warning,
when any requested tag is not asleep: ``wake_up(["weights", "kv_cache"])`` after ``wake_up(["weights"])``
wakes nothing, and the next generate runs over an unmapped KV cache. A wake (:func:`plan`) asks only for the
requested tags that are asleep; on vLLM >= 0.31 a worker's wake goes on as asked (:func:`executor_guards`).
"""
from __future__ import annotations

from shim.vllm import engines

TAGS = engines.TAGS


def executor_guards() -> bool:
    """vLLM >= 0.31: its executor guards a worker's wake and knows discarded tags.

    vLLM >= 0.31 (read in the 0.31.0-0.34.0 wheels, ``v1/executor/abstract.py``,
    ``device_allocator/cumem.py``): the executor forwards a wake to its workers only
    when every requested tag is asleep in its own record, which also knows the KV
    cache a ``discard`` released (``release_kv_cache_memory``); the allocator maps
    only what is asleep. So a worker passes vLLM's wake on as asked
    (:func:`plan` with ``asleep`` None): the executor is the authority, never the shim's
    worker record. Its ``sleep`` is refused only while ``weights`` is asleep
    (:func:`sleep_refused`), not while a discarded KV cache is.
    """
    from shim.engine.versions import installed_in

    return installed_in("vllm", ">=0.31.0")


def releases_before_wake() -> bool:
    """vLLM >= 0.30 runs gc + empty_cache before waking itself: no second collection."""
    from shim.engine.versions import installed_in

    return installed_in("vllm", ">=0.30.0")


def sleep_refused(asleep) -> bool:
    """Whether vLLM's executor ignores a sleep while ``asleep`` tags are asleep."""
    return "weights" in asleep if executor_guards() else bool(asleep)


def plan(asleep, tags) -> "tuple[bool, object, list]":
    """``(call, tags_to_pass, woken)``: whether to call vLLM's wake_up, with which tags, and which tags
    that wakes, given the tags ``asleep`` now (``SleepState.asleep_now``). ``tags=None`` (everything) is
    passed as None. ``asleep`` None: vLLM's executor checks the tags itself (a worker on vLLM >= 0.31):
    the call goes on as asked.

    A wake (``SleepState.wake``, on this plan) asks only for the requested tags that are asleep, skips the call when none
    is, and gives cached blocks back first (gc + the device's ``empty_cache``:
    re-mapped physical pages cannot reuse blocks PyTorch caches; vLLM >= 0.30 does
    this itself, :func:`releases_before_wake`). It never passes an empty tag list (vLLM would
    mark every tag awake without mapping any).
    """
    if asleep is None:
        return True, tags, sorted(TAGS if tags is None else [t for t in tags if t in TAGS])
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
