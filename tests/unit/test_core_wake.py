"""``vllm-core-wake-plan`` (``shim.vllm.sleep.core_wake``) where the engine core runs in the trainer's process:
vLLM's ``LLMEngine`` with an ``InprocClient`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) holds the
``EngineCore`` as ``engine_core.engine_core`` and reads ``model_executor`` off it (0.24
``llm_engine.py:125``). The engine's sleep check plans the wake and adopts the core; the core's
wrapper then passes the call through (one plan per wake). Shapes only: the stand-in's in-process
``LLMEngine`` merges its core into itself, so these are plain objects of vLLM's attribute names."""
from __future__ import annotations

from types import SimpleNamespace

from shim.vllm import engines
from shim.vllm.sleep import core_wake, sleep_state


class _Core:
    """``EngineCore`` with an executor that reports ``kv_cache`` asleep (the weights woken already)."""

    def __init__(self):
        self.model_executor = SimpleNamespace(sleeping_tags={"kv_cache"}, is_sleeping=True)
        self.calls = []

    def wake_up(self, tags=None):
        self.calls.append(tags)


def _wake(core, tags):
    return core_wake.plan_wake(core.wake_up, core, (tags,), {})


def test_core_passes_only_the_asleep_tags():
    core = _Core()
    _wake(core, ["weights", "kv_cache"])
    _wake(core, ["scheduling", "weights", "kv_cache"])
    _wake(core, ["weights"])  # nothing asked is asleep: vLLM's own handling, as asked
    _wake(core, None)
    assert core.calls == [["kv_cache"], ["kv_cache", "scheduling"], ["weights"], None]


def test_in_process_core_adopted_by_the_engine_passes_through():
    core = _Core()
    engine = SimpleNamespace(engine_core=SimpleNamespace(engine_core=core), model_executor=core.model_executor)
    assert engines.in_process_core(engine) is core
    state = sleep_state.state_for(engine)
    state.adopt_workers()
    assert sleep_state.state_for(core).owner is state
    with state.calling():  # the engine's check acts on this wake: it planned the tags
        _wake(core, ["weights", "kv_cache"])
    _wake(core, ["weights", "kv_cache"])  # a call of the core alone: planned here
    assert core.calls == [["weights", "kv_cache"], ["kv_cache"]]
    # a client of a core in another process holds no core object
    assert engines.in_process_core(SimpleNamespace(engine_core=SimpleNamespace())) is None
