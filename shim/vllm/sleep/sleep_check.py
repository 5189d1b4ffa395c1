"""The sleep check on vLLM engines: every sleep verified, per-tag wake, telemetry (patches
``vllm-sleep-check`` on ``LLMEngine`` and ``vllm-llm-sleep-check`` on ``vllm.LLM``).

A sleep frees only what vLLM's sleep pool holds, and nothing says when it freed nothing. These are the
wrappers; the engine's ``SleepState`` (``shim.vllm.sleep.sleep_state``) carries out each check. Only the
outermost wrapper of a call on one engine acts (:func:`check_sleep`); a construction is recorded once
(:func:`check_llm_init`); sleep verification is :func:`sleep_on`.

Faults: whatever vLLM's call raises (an OOM in ``wake_up``, an error or an interrupt in ``sleep`` or the
construction) reaches the caller unchanged; the engine's ``SleepState`` is re-read from the executor
(``SleepState.resync``), the ``Call`` is cleared, and the allocator guard's ``finally`` has put the user's
setting back, so the next sleep and wake work as usual.
"""
from __future__ import annotations

import time

from shim.engine import call_args
from shim.observe import events
from shim.vllm import engines
from shim.vllm.sleep import alloc_guard, memory, sleep_pool, sleep_state


# ---------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------
def check_init(wrapped, instance, args, kwargs):
    """``LLMEngine.__init__``: what the construction took, what the pool tracks, the routes."""
    return _init(wrapped, instance, args, kwargs, full_gc=True)


def check_llm_init(wrapped, instance, args, kwargs):
    """``LLM.__init__``: the same, only where the engine's own ``check_init`` did not run
    (``vllm-sleep-check`` off). Its reading before the call collects only the young
    generations (a full collection costs 0.1-0.5 s, and the engine's check does one).

    Construction is the other way round from sleep and wake (:func:`check_sleep`): ``LLM.__init__``
    builds its engine inside, so the engine's own check (``check_init``) records it and the ``LLM``
    one (``check_llm_init``) acts only where that did not run (the engine's ``SleepState.built``).
    """
    return _init(wrapped, instance, args, kwargs, full_gc=False)


def _init(wrapped, instance, args, kwargs, full_gc):
    probe = memory.probe()
    want = call_args.requested_sleep_mode(wrapped, args, kwargs)
    routes = alloc_guard.routes_on(probe)
    free0 = memory.read_settled(probe, full_gc=full_gc)[0] if probe is not None else None
    t0 = time.perf_counter()
    result = wrapped(*args, **kwargs)  # an exception reaches the caller as it is: nothing to undo
    seconds = time.perf_counter() - t0
    engine = engines.engine_of(instance)
    state = sleep_state.state_for(engine)
    state.adopt_workers()
    if state.measure.built:  # the engine's own check recorded it (LLM.__init__ builds an LLMEngine inside)
        return result
    state.measure.built = True
    name = state.name()
    mode = engines.sleep_mode(engine)
    state.measure.sleep_mode = want if mode is None else mode
    state.measure.init_routes = routes or list(state.measure.guard_saw)  # guard_saw: this check ran inside the guard
    if probe is None:
        return result
    free1, total = memory.read_settled(probe)
    state.measure.engine_bytes = max(free0 - free1, 0)
    tracked = sleep_pool.tracked_bytes(probe)
    state.measure.tracked_bytes = tracked
    note = []
    if not state.measure.sleep_mode:
        note.append("built without enable_sleep_mode: sleep cannot free it")
    if state.measure.init_routes:
        note.append(f"expandable segments on via {', '.join(state.measure.init_routes)}"
                    + ("; off during construction (shim guard)" if state.measure.guarded_init else "; NOT guarded"))
    events.emit("init", name, seconds, taken=state.measure.engine_bytes, tracked=tracked, asleep=[],
                   free=free1, total=total, note="; ".join(note))
    return result


# ---------------------------------------------------------------------------
# sleep and wake: the engine's SleepState checks them
# ---------------------------------------------------------------------------
def check_sleep(wrapped, instance, args, kwargs):
    """``sleep`` of ``LLMEngine`` / ``LLM`` (:func:`sleep_on`).

    No double counting: ``LLM.sleep`` delegates to ``LLMEngine.sleep`` (likewise
    ``wake_up``), state is keyed by the engine (``shim.vllm.engines.engine_of``) and
    only the OUTERMOST wrapper of a call on one engine acts: it puts a
    ``Call`` on the engine's ``SleepState`` for the duration of the
    call, and an inner wrapper that finds one of its thread passes straight
    through.
    """
    return sleep_on(engines.engine_of(instance), wrapped, args, kwargs)


def sleep_on(engine, wrapped, args, kwargs, holds_memory=None):
    """The sleep check of one sleep of ``engine`` (``SleepState.sleep``). ``holds_memory``: the device
    memory is in this process (default: the engine has an in-process executor;
    ``shim.vllm.sleep.worker_check`` passes True for vLLM's worker, which holds it wherever it runs).

    Sleep verification (every sleep at level >= 1 of an in-process engine): the
    bytes the sleep pool tracks (``shim.vllm.sleep.sleep_pool``) against the bytes the sleep
    gave back, read on the device (``mem_get_info`` before and after,
    ``shim.vllm.sleep.memory``) or taken from the pool's bookkeeping: which one, and why that
    is safe, is ``shim.vllm.sleep.sleep_verdict``'s rule (first sleep per level, after an
    ineffective one, when the bookkeeping looks wrong, and every
    ``SHIM_DEVICE_CHECK_EVERY``-th sleep read the device; each record's
    ``measured`` says which). Ineffective (``sleep_verdict.judge``): one WARNING
    with the numbers, the likely cause and the fix; the first-sleep reset follows
    (``shim.vllm.sleep.first_sleep_reset``).

    Each sleep/wake record carries ``shim_s``, the seconds the shim spent around
    vLLM's call from the outermost wrapper's entry, the allocator guard's suspend
    and resume included (the telemetry line itself excluded); ``seconds`` is
    vLLM's call alone.

    Sleep while partially awake (e.g. ``wake_up(["weights"])`` then ``sleep()``):
    vLLM's executor ignores it ("Executor is already sleeping") and the woken tag
    stays mapped; the check wakes the remaining tags first, so the sleep frees
    everything.
    """
    entered = time.perf_counter()
    return sleep_state.state_for(engine).sleep(wrapped, args, kwargs, holds_memory, entered)


def check_wake(wrapped, instance, args, kwargs):
    return wake_on(engines.engine_of(instance), wrapped, args, kwargs)


def wake_on(engine, wrapped, args, kwargs, holds_memory=None, as_asked=False):
    """The per-tag wake and its record, for one wake of ``engine`` (``SleepState.wake``; ``holds_memory``:
    as :func:`sleep_on`; ``as_asked``: vLLM's tags passed unchanged, ``wake_plan.plan``)."""
    entered = time.perf_counter()
    return sleep_state.state_for(engine).wake(wrapped, args, kwargs, holds_memory, as_asked, entered)
