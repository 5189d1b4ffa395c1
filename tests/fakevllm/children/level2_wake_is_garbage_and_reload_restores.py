# test_fake.py test_level2_wake_is_garbage_and_reload_restores: a body that runs after children/prelude.py.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import EVENTS, RESULT, new_llm, toks, wfp

llm = new_llm()
fp0, t0 = wfp(llm), toks(llm)
llm.sleep(level=2); llm.wake_up()
RESULT["garbage"] = wfp(llm) != fp0
RESULT["garbage_toks_differ"] = toks(llm) != t0
RESULT["origin"] = llm.llm_engine.model_executor.driver_worker.model_runner.weights_origin
llm.collective_rpc("reload_weights")
RESULT["restored"] = wfp(llm) == fp0 and toks(llm) == t0
gens = [e for e in EVENTS if e["event"] == "generate"]
RESULT["is_ckpt"] = [g["is_checkpoint"] for g in gens]
