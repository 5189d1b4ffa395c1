# The verdict's threshold (test_sleep_verdict.py test_ineffective_threshold_is_half_of_what_the_pool_tracks): a
# pool of which only FREED_SHARE comes back at a sleep. After held.py. A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py).
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, free, gen, new_llm, tracked
    from tests.unit.children.held import KEEP, pool_alloc

llm = new_llm(gpu_memory_utilization=0.2)
freed_share = float(os.environ["FREED_SHARE"])
t = tracked()
pool_alloc(int(t * (1 - freed_share) / freed_share), "held")
KEEP.add("held")
R["tracked"] = tracked()
a = free(); llm.sleep(level=1); R["freed"] = free() - a
llm.wake_up(); R["tokens"] = len(gen(llm))
