# A prefix-cache reset that fails once, nothing in flight (test_push_caches.py
# test_reset_false_once_with_nothing_in_flight_is_retried_at_once). A stand_in body (after tests/support/children/stand_in_prelude.py).
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, new_llm

from vllm.v1.engine.llm_engine import LLMEngine

calls = []
def once_false(self, reset_running_requests=False):  # a transient failure: nothing is in flight
    calls.append(reset_running_requests)
    return len(calls) > 1
LLMEngine._core_reset_prefix_cache = once_false
llm = new_llm(enable_sleep_mode=False)
R["unfinished"] = llm.llm_engine.has_unfinished_requests()
R["result"] = llm.reset_prefix_cache()
R["calls"] = calls
