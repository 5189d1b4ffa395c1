"""Faults inside a wrapped vLLM call (issue 10 item 9), for every wrapper the vLLM patches install.

``patches/vllm_sleep_guard.py`` wraps ``LLMEngine.__init__`` / ``sleep`` / ``wake_up``
(``vllm-sleep-guard``: allocator guard on ``__init__`` and ``wake_up``; ``vllm-sleep-check``:
all three) and ``LLM.__init__`` / ``sleep`` / ``wake_up`` (``vllm-llm-sleep-check``). Each case
makes one of them the wrapper that acts, then lets the upstream call under it fail twice, in a
fresh interpreter on the vLLM stand-in (NPU mode, expandable segments on through
``PYTORCH_ALLOC_CONF`` and the live setting, so the allocator guard has something to suspend):

- construction: ``Worker.load_model`` raises (an unreadable checkpoint), then a
  ``KeyboardInterrupt`` there; the stand-in's ``load_model`` runs inside
  ``CuMemAllocator.use_memory_pool("weights")`` as vLLM's ``gpu_worker.Worker.load_model`` does;
- sleep: ``CuMemAllocator.sleep`` raises (a CUDA error), then a ``KeyboardInterrupt`` there
  (mid level-2 sleep);
- wake: a real out-of-memory on the stand-in (the trainer holds the memory the re-map needs;
  ``CuMemAllocator.wake_up`` rolls back and re-raises, as vLLM's does), then a
  ``KeyboardInterrupt`` in ``CuMemAllocator.wake_up``.

After each fault: the caller got the very exception raised below the wrappers, the user's
allocator setting (every env var, the live setting) is back, and the shim's sleep state says
what vLLM's executor says is asleep (and, after a failed level-2 sleep, that the weights may be
discarded, so the TRL proxy pushes before the next generate). Then a sleep frees what the pool tracks, the wake works,
the engine generates, the setting is still the user's.
"""
from __future__ import annotations

import pytest

from tests.support.vllm_scenario import VALUE, scenario


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


FAULT_BODY = """
from shim.vllm import sleep_state
from vllm.device_allocator.cumem import CuMemAllocator
from vllm.v1.worker.gpu_worker import Worker
VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
ENTRY, FAULT = os.environ["ENTRY"], os.environ["FAULT"]
mem.memory._set_allocator_settings(VALUE)  # the user's live setting, on top of PYTORCH_ALLOC_CONF

def settings():
    return {"env": {k: os.environ.get(k) for k in VARS}, "live": dev.expandable_segments}

USER = settings()
R["faults"] = []

def build():
    if ENTRY == "llm":
        return new_llm()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    dev.ensure_init()
    return LLMEngine.from_engine_args(EngineArgs(model=MODEL, enable_sleep_mode=True, gpu_memory_utilization=0.5,
                                                 distributed_executor_backend="external_launcher"))

def engine(x):
    return getattr(x, "llm_engine", x)

def consistent(x):
    ex = engine(x).model_executor
    shim_view = sleep_state.state_for(x)
    return {"shim": sorted(shim_view.asleep), "vllm": sorted(ex.sleeping_tags) if ex.is_sleeping else [],
            "call_cleared": shim_view.call is None, "weights_valid": shim_view.weights_valid}

def once(owner, name, exc):
    orig = owner.__dict__[name]
    def faulty(*a, **k):
        setattr(owner, name, orig)
        raise exc
    setattr(owner, name, faulty)

def attempt(label, fn, injected, x=None):
    try:
        fn()
    except BaseException as e:
        rec = {"label": label, "type": type(e).__name__, "same": (e is injected) if injected is not None else None,
               "msg": str(e)[:160], "settings_ok": settings() == USER}
        if x is not None:
            rec["state"] = consistent(x)
        R["faults"].append(rec)
    else:
        R["faults"].append({"label": label, "type": None})

x = None
if FAULT == "init":
    e1 = RuntimeError("injected: checkpoint unreadable")
    once(Worker, "load_model", e1)
    attempt("error", build, e1)
    e2 = KeyboardInterrupt()
    once(Worker, "load_model", e2)
    attempt("interrupt", build, e2)
    x = build()
elif FAULT == "sleep":
    x = build()
    e1 = RuntimeError("injected: CUDA error: an illegal memory access was encountered")
    once(CuMemAllocator, "sleep", e1)
    attempt("error", lambda: x.sleep(level=1), e1, x)
    e2 = KeyboardInterrupt()
    once(CuMemAllocator, "sleep", e2)
    attempt("interrupt", lambda: x.sleep(level=2), e2, x)
elif FAULT == "wake":
    x = build()
    x.sleep(level=1)
    blk = dev.allocate(int(free() * 0.95), label="trainer")  # the trainer holds what the re-map needs
    attempt("oom", lambda: x.wake_up(), None, x)
    dev.free(blk); dev.empty_cache()
    e2 = KeyboardInterrupt()
    once(CuMemAllocator, "wake_up", e2)
    attempt("interrupt", lambda: x.wake_up(tags=["weights"]), e2, x)

# the next sleep and wake work
if engine(x).is_sleeping():
    x.wake_up()
a = free(); x.sleep(level=1); freed = free() - a
asleep = consistent(x)
x.wake_up()
R["after"] = {"freed": freed, "tracked": tracked(), "asleep": asleep, "awake": consistent(x),
              "settings_ok": settings() == USER}
if ENTRY == "llm":
    R["after"]["tokens"] = len(gen(x))
"""

CASES = {
    # wrapper that acts: (entry object, fault, patches switched off)
    "LLM.__init__": ("llm", "init", "vllm-sleep-check"),  # the LLM's own construction check acts
    "LLMEngine.__init__": ("engine", "init", ""),         # allocator guard + construction check
    "LLM.sleep": ("llm", "sleep", ""),                   # outermost: LLM's check; LLMEngine's passes through
    "LLMEngine.sleep": ("engine", "sleep", ""),           # ms-swift's path
    "LLM.wake_up": ("llm", "wake", ""),                   # LLM's check outermost, allocator guard inside
    "LLMEngine.wake_up": ("engine", "wake", ""),          # allocator guard + check on the engine
}
EXPECTED = {"init": [("error", "RuntimeError"), ("interrupt", "KeyboardInterrupt")],
            "sleep": [("error", "RuntimeError"), ("interrupt", "KeyboardInterrupt")],
            "wake": [("oom", "OutOfMemoryError"), ("interrupt", "KeyboardInterrupt")]}


@pytest.mark.parametrize("wrapper", list(CASES))
def test_fault_inside_wrapped_call(model_dir, wrapper):
    entry, fault, disabled = CASES[wrapper]
    env = dict(FAKEVLLM_DEVICE="npu", PYTORCH_ALLOC_CONF=VALUE, ENTRY=entry, FAULT=fault,
               SHIM_DISABLED_PATCHES=disabled)
    out, proc = scenario(model_dir, f"VALUE = {VALUE!r}\n" + FAULT_BODY, shim=True, check=False, **env)
    assert proc.returncode == 0 and out is not None, proc.stderr[-3000:]
    assert [(f["label"], f["type"]) for f in out["faults"]] == EXPECTED[fault], out["faults"]
    for f in out["faults"]:
        if f["same"] is not None:
            assert f["same"] is True, f  # the very exception raised below the wrappers
        assert f["settings_ok"], f  # the user's allocator setting is back, never left suspended
        if "state" in f:
            assert f["state"]["shim"] == f["state"]["vllm"] and f["state"]["call_cleared"], f
    if fault == "sleep":  # a level-2 sleep that failed may have discarded weights: they count as discarded
        assert [f["state"]["weights_valid"] for f in out["faults"]] == [True, False], out["faults"]
    if fault == "wake":  # the failed wakes woke nothing
        assert all(f["state"]["vllm"] == ["kv_cache", "weights"] for f in out["faults"]), out["faults"]
    after = out["after"]
    assert after["tracked"] > 10 << 30 and after["freed"] >= 0.9 * after["tracked"], after
    assert after["asleep"]["shim"] == after["asleep"]["vllm"] == ["kv_cache", "weights"], after
    assert after["awake"]["shim"] == after["awake"]["vllm"] == [] and after["settings_ok"], after
    if entry == "llm":
        assert after["tokens"] == 3
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
