"""The per-tag wake rule in vLLM's engine core (patch ``vllm-core-wake-plan`` on
``vllm.v1.engine.core.EngineCore.wake_up``).

vLLM's executor ignores the WHOLE ``wake_up(tags)`` call, with a warning, when any requested tag is not asleep
(``Executor.wake_up``, vllm/v1/executor/abstract.py: "Tag %s is not in sleeping tags"), so
``wake_up(["weights", "kv_cache"])`` after ``wake_up(["weights"])`` maps no KV cache; and from 0.24
``EngineCore.wake_up`` resumes the scheduler only once the executor is fully awake, so the engine then accepts
requests and never runs them. The engine-level sleep check (``shim.vllm.sleep.sleep_check``) passes only the
asleep tags (``shim.vllm.sleep.wake_plan``), but only where it sees the executor; the worker's own check
(``shim.vllm.sleep.worker_check``) is below the executor, which has already dropped the call. Where the
executor lives in the engine-core process only this wrapper (:func:`plan_wake`) sees the wake.
"""
from __future__ import annotations

from shim.engine import call_args, log
from shim.vllm import engines
from shim.vllm.sleep import sleep_state, wake_plan


def plan_wake(wrapped, instance, args, kwargs):
    """``EngineCore.wake_up`` in the process that holds the executor: passes the requested tags that the
    executor reports asleep (plus the non-memory tags, e.g. "scheduling").

    The engine-level check (on ``LLMEngine`` / ``LLM``) cannot: with ``AsyncLLM`` (verl, OpenRLHF,
    ``vllm serve``) or ``vllm.LLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=1`` the executor lives in the
    engine-core process, and the wake reaches it as a utility call (``EngineCoreProc`` runs
    ``getattr(self, "wake_up")(tags)``) that no wrapper of the trainer's process sees.

    Everything else goes through as asked: ``tags=None``; a wake where no requested tag is asleep
    (vLLM's executor ignores it, the core resumes the scheduler itself; the list never becomes empty:
    an empty one would mark every tag awake on releases that pass it to the executor); an executor that
    reports no ``sleeping_tags``. Where an in-process engine's check already planned the same wake
    (``LLMEngine`` with an ``InprocClient``: its core is adopted, ``SleepState.owner``), the core's
    wrapper passes through: one plan per wake. The wake's record stays the worker's
    (``vllm-worker-sleep-check``), from the process that holds the memory.
    """
    tags = call_args.arg(wrapped, args, kwargs, "tags")
    if tags is None or engines.reported_asleep(instance) is None:
        return wrapped(*args, **kwargs)
    state = sleep_state.state_for(instance)
    if state.owner is not None and state.owner.acting():  # the in-process engine's check planned this wake
        return wrapped(*args, **kwargs)
    do_call, pass_tags, _ = wake_plan.plan(state.asleep_now(), list(tags))
    if not do_call or list(pass_tags) == list(tags):
        return wrapped(*args, **kwargs)
    log.debug(f"engine core wake_up({list(tags)}): passing {pass_tags}, the others are awake "
              f"(vLLM's executor ignores a wake naming an awake tag)")
    return wrapped(pass_tags)
