"""The allocator guard on a vLLM engine's build and ``wake_up`` (patch ``vllm-sleep-guard``).

In this package "guard" means one thing: the allocator guard of ``shim.vllm.sleep.alloc_guard`` (expandable
segments off on every route while a sleep allocator fills its pool, the user's exact setting back
afterwards). This module puts it around the two calls of ``vllm.v1.engine.llm_engine.LLMEngine`` that
allocate into the pool: ``__init__`` (weights, KV cache) and ``wake_up`` (re-mapped pages). ``vllm.LLM``
builds and wakes through them; ms-swift calls the engine directly.

What the sleep check (``shim.vllm.sleep.sleep_check``, other patches) needs from it goes on the engine's
``SleepState``: ``guarded_init`` / ``guard_saw`` at construction, and the guard's own seconds on the running
check's ``Call`` (``guard_s``). Whatever the upstream call raises reaches the caller unchanged, after the
user's setting is back (``alloc_guard.resume`` in ``finally``; it never raises).
"""
from __future__ import annotations

import time

from shim.engine import call_args
from shim.vllm import engines
from shim.vllm.sleep import alloc_guard, memory, sleep_state


def guard_init(wrapped, instance, args, kwargs):
    """Construction of a sleep-mode engine with expandable segments off."""
    probe = memory.probe()
    if probe is None or not call_args.requested_sleep_mode(wrapped, args, kwargs):
        return wrapped(*args, **kwargs)
    state = sleep_state.state_for(instance)
    token = alloc_guard.suspend(probe)
    try:
        state.measure.guarded_init = True
        state.measure.guard_saw = list(token.saw) if token is not None else []
        return wrapped(*args, **kwargs)
    finally:
        alloc_guard.resume(token)


def guard_wake(wrapped, instance, args, kwargs):
    """``wake_up`` of a sleep-mode engine with expandable segments off; the guard's own
    seconds (suspend + resume) go to the running sleep check's ``Call``, if any."""
    t0 = time.perf_counter()
    probe = memory.probe()
    engine = engines.engine_of(instance)
    if probe is None or engines.sleep_mode(engine) is False:
        return wrapped(*args, **kwargs)
    token = alloc_guard.suspend(probe)
    t1 = time.perf_counter()
    try:
        return wrapped(*args, **kwargs)
    finally:
        t2 = time.perf_counter()
        alloc_guard.resume(token)
        call = sleep_state.state_for(engine).call
        if call is not None and call.mine():
            call.guard_s += (t1 - t0) + (time.perf_counter() - t2)
