# test_fake.py test_executor_guards: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import EVENTS, RESULT, new_llm

llm = new_llm()
ex = llm.llm_engine.model_executor
llm.sleep(level=1); n0 = len([e for e in EVENTS if e["event"] == "worker_sleep"])
llm.sleep(level=2)   # warning no-op
RESULT["second_sleep_noop"] = len([e for e in EVENTS if e["event"] == "worker_sleep"]) == n0
llm.wake_up(tags=["weights"])
RESULT["after_weights"] = sorted(ex.sleeping_tags)
llm.wake_up(tags=["weights", "kv_cache"])   # weights not asleep -> wakes NOTHING
RESULT["after_both"] = sorted(ex.sleeping_tags)
RESULT["kv_mapped"] = ex.driver_worker.model_runner.kv_alloc.mapped
llm.wake_up(tags=["kv_cache"])
RESULT["awake"] = (not ex.is_sleeping) and not llm.llm_engine.is_sleeping()
llm.wake_up()   # not sleeping -> warning no-op
RESULT["guards"] = [e["note"] for e in EVENTS if e["event"] == "executor_guard"]
try:
    llm.collective_rpc("definitely_missing"); RESULT["rpc"] = "ok"
except NotImplementedError as e:
    RESULT["rpc"] = str(e)
