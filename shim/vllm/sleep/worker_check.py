"""The sleep check and the allocator guard where the memory lives: vLLM's worker (patches
``vllm-worker-sleep-guard`` and ``vllm-worker-sleep-check`` on ``vllm.v1.worker.gpu_worker.Worker``).

A trainer that drives ``vllm.v1.engine.async_llm.AsyncLLM`` (verl, OpenRLHF, ``vllm serve``), or ``vllm.LLM``
with ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` (vLLM's default), keeps the engine core in another process
(``EngineCoreProc``, started by ``MPClient`` through multiprocessing spawn or fork); with one GPU its
``UniProcExecutor`` builds the ``Worker`` there, and the worker's pool allocations, ``sleep`` and ``wake_up``
happen there. The engine-level wrappers (``shim.vllm.sleep.sleep_check`` on ``LLMEngine`` / ``LLM``) see no
executor in the trainer's process and only keep the record; these wrappers run in the process of the worker
(:func:`check_init`, :func:`guard_alloc`, :func:`check_sleep`, :func:`check_wake`, :func:`check_discard`).
"""
from __future__ import annotations

from shim.engine import call_args
from shim.vllm import engines
from shim.vllm.sleep import alloc_guard, memory, sleep_check, sleep_state, wake_plan


def _owner_acting(state) -> bool:
    return state.owner is not None and state.owner.acting()


def check_init(wrapped, instance, args, kwargs):
    """``Worker.__init__``: the worker's ``SleepState`` gets its ``sleep_mode`` and the expandable-segments
    routes on at construction."""
    result = wrapped(*args, **kwargs)
    try:
        state = sleep_state.state_for(instance)
        state.measure.built = True
        state.measure.sleep_mode = engines.sleep_mode(instance)
        probe = memory.probe()
        if probe is not None:
            state.measure.init_routes = alloc_guard.routes_on(probe)
    except Exception:  # a record for later lines: never the reason a worker fails to start
        pass
    return result


def check_sleep(wrapped, instance, args, kwargs):
    """``Worker.sleep``: the sleep check of ``shim.vllm.sleep.sleep_check`` (freed vs the pool, the
    ineffective-sleep WARNING, the first-sleep reset, per-tag wake, telemetry), on the worker's own
    state: the record's ``engine`` is ``Worker#<n>``, its ``pid`` the worker's process.

    No double counting: where an in-process engine's check acts (TRL / ms-swift colocate: ``LLMEngine``
    with the worker in this process), that check makes itself the worker's ``owner``
    (``SleepState.owner``, set by its ``adopt_workers``); while the owner's call runs in this thread the
    worker's check passes through and only keeps the worker's record in step. So each sleep is one
    record: the engine's where the engine holds its worker, the worker's where it does not.
    """
    state = sleep_state.state_for(instance)
    if _owner_acting(state):
        result = wrapped(*args, **kwargs)
        level = call_args.arg(wrapped, args, kwargs, "level", 1)
        sleep_state.note_sleep(instance, level if isinstance(level, int) else 1)
        return result
    return sleep_check.sleep_on(instance, wrapped, args, kwargs, holds_memory=True)


def check_wake(wrapped, instance, args, kwargs):
    """``Worker.wake_up``: the sleep check's wake (as :func:`check_sleep`, owner included).

    The per-tag wake rule at this level (``shim.vllm.sleep.wake_plan``: only the requested tags that are
    asleep are passed) needs the worker's own record, so it applies only once the shim saw this
    worker fall asleep; before that every wake goes through as asked. On vLLM >= 0.31 the executor
    checks the tags before it calls the worker, so the worker's wake always goes through as asked.
    """
    state = sleep_state.state_for(instance)
    if _owner_acting(state) or state.level is None:  # owner acts / no sleep of this worker seen yet
        result = wrapped(*args, **kwargs)
        sleep_state.note_wake(instance, call_args.arg(wrapped, args, kwargs, "tags"))
        return result
    return sleep_check.wake_on(instance, wrapped, args, kwargs, holds_memory=True,
                               as_asked=wake_plan.executor_guards())


def check_discard(wrapped, instance, args, kwargs):
    """``Worker.discard(tags)`` (vLLM >= 0.31): the tags released without a sleep are asleep in the
    worker's record, so its next sleep and wake are measured and judged on what is still mapped."""
    result = wrapped(*args, **kwargs)
    tags = call_args.arg(wrapped, args, kwargs, "tags")
    sleep_state.note_discard(instance, [tags] if isinstance(tags, str) else tags or ())
    return result


def guard_alloc(wrapped, instance, args, kwargs):
    """``load_model`` / ``initialize_from_config`` of a sleep-mode worker with expandable segments off.

    These are where the weights and the KV cache are allocated into the sleep pool (vLLM's
    ``_maybe_get_memory_pool_context``); they run inside the allocator guard, the user's setting back
    afterwards. The worker's ``wake_up`` (re-mapped pages) is guarded through
    ``shim.vllm.sleep.engine_guard.guard_wake``, the engine's own, which reads the worker's sleep mode and
    books its seconds on the worker's running check.
    """
    probe = memory.probe()
    if probe is None or not engines.sleep_mode(instance):
        return wrapped(*args, **kwargs)
    state = sleep_state.state_for(instance)
    token = alloc_guard.suspend(probe)
    try:
        state.measure.guarded_init = True
        if token is not None and token.saw:
            state.measure.guard_saw = list(token.saw)
        return wrapped(*args, **kwargs)
    finally:
        alloc_guard.resume(token)
