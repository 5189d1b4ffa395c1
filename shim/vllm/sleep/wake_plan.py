"""What a vLLM engine says about its sleep, and per-tag wake; shared by the sleep check
(``shim.vllm.sleep.sleep_check``) and the TRL proxy (``shim.trl.synced_llm``).

vLLM's executor (``vllm/v1/executor/abstract.py``) ignores the WHOLE
``wake_up(tags)`` call, with a warning, when any requested tag is not asleep:
``wake_up(["weights", "kv_cache"])`` after ``wake_up(["weights"])`` wakes
nothing, and the next generate runs over an unmapped KV cache. :func:`wake`
asks only for the requested tags that are asleep, skips the call when none
is, and gives cached blocks back first (gc + the device's ``empty_cache``:
re-mapped physical pages cannot reuse blocks PyTorch caches; vLLM >= 0.30 does
this itself). It never passes an empty tag list (vLLM would mark every tag
awake without mapping any).

vLLM >= 0.31 (read in the 0.31.0-0.34.0 wheels, ``v1/executor/abstract.py``,
``device_allocator/cumem.py``): the executor forwards a wake to its workers only
when every requested tag is asleep in its own record, which also knows the KV
cache a ``discard`` released (``release_kv_cache_memory``); the allocator maps
only what is asleep. So a worker passes vLLM's wake on as asked
(:func:`plan` ``as_asked``): the executor is the authority, never the shim's
worker record. Its ``sleep`` is refused only while ``weights`` is asleep
(:func:`sleep_refused`), not while a discarded KV cache is.
"""
from __future__ import annotations

from shim.vllm import engines
from shim.vllm.sleep import memory, sleep_state

TAGS = engines.TAGS


def asleep_tags(obj) -> set:
    """Tags vLLM's executor reports asleep (``sleeping_tags``), else the shim's record."""
    tags = engines.reported_asleep(obj)
    return tags if tags is not None else set(sleep_state.state_for(obj).asleep)


def executor_guards() -> bool:
    """vLLM >= 0.31: its executor guards a worker's wake and knows discarded tags (module doc)."""
    from shim.engine.versions import installed_in

    return installed_in("vllm", ">=0.31.0")


def sleep_refused(asleep) -> bool:
    """Whether vLLM's executor ignores a sleep while ``asleep`` tags are asleep."""
    return "weights" in asleep if executor_guards() else bool(asleep)


def plan(obj, tags, as_asked: bool = False) -> "tuple[bool, object, list]":
    """``(call, tags_to_pass, woken)``: whether to call vLLM's wake_up, with which tags,
    and which tags that wakes. ``tags=None`` (everything) is passed as None. ``as_asked``:
    vLLM's executor already checked the tags (a worker on vLLM >= 0.31): the call goes on unchanged."""
    if as_asked:
        return True, tags, sorted(TAGS if tags is None else [t for t in tags if t in TAGS])
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
