# A fault inside a wrapped vLLM call, twice, then a sleep and a wake that work (test_sleep_faults.py
# test_fault_inside_wrapped_call). A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py).
# ENTRY: "llm" or "engine" (what is built and called); FAULT: "init", "sleep" or "wake"; TEST_VALUE: the
# user's live allocator setting.
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import MODEL, R, dev, free, gen, mem, new_llm, tracked

VALUE = os.environ["TEST_VALUE"]

from vllm.device_allocator.cumem import CuMemAllocator

if os.environ.get("FAKEVLLM_DEVICE") == "npu":  # vllm-ascend's NPUWorker defines load_model itself
    from vllm_ascend.worker.worker import NPUWorker as Worker
else:
    from vllm.v1.worker.gpu_worker import Worker

from shim.vllm.sleep import sleep_state

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
