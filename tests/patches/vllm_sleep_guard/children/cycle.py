# A build, a sleep, a wake and a generate, a second sleep (test_sleep_check.py: the ineffective sleeps, the
# first-sleep reset, the trace). A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py).
# TEST_KW: new_llm's keywords (JSON); TEST_THEN: "again" (then a wake, a generate and a sleep more), "boom"
# (the engine's wake_up raises from the second sleep on, and the program goes on).
import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, free, gen, new_llm

KW = json.loads(os.environ.get("TEST_KW", "{}"))
THEN = os.environ.get("TEST_THEN", "")
def boom(*a, **k):
    raise RuntimeError('wake_up broke')
llm = new_llm(**KW)
a = free(); llm.sleep(level=1); R["freed"] = free() - a
llm.wake_up(); R["tokens"] = len(gen(llm))
if THEN == "boom":
    llm.llm_engine.wake_up = boom
a = free(); llm.sleep(level=1); R["freed2"] = free() - a
if THEN == "again":
    R['asleep'] = llm.llm_engine.is_sleeping()
    llm.wake_up(); R['tokens2'] = list(gen(llm)); llm.sleep(level=1)
if THEN == "boom":
    R['after'] = 'went on'
