# ms-swift #6636, one route of turning expandable segments on (test_sleep_check.py
# test_issue_6636_every_route): the engine's construction, two sleeps and a wake, the user's setting after.
# A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py); TEST_VALUE: the setting,
# LIVE=1: set live, through the allocator.
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, dev, free, gen, mem, new_llm, tracked

VALUE = os.environ["TEST_VALUE"]
VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
if os.environ.get("LIVE"):
    mem.memory._set_allocator_settings(VALUE)
f0 = free()
try:
    llm = new_llm()
except AssertionError as e:
    R["error"] = str(e)
else:
    R["engine"] = f0 - free()
    R["tracked"] = tracked()
    a = free(); llm.sleep(level=1); R["freed"] = free() - a
    llm.wake_up(tags=["weights"]); llm.wake_up(tags=["kv_cache"])
    R["tokens"] = len(gen(llm))
    a = free(); llm.sleep(level=1); R["freed2"] = free() - a
    llm.wake_up()
R["env"] = {k: os.environ.get(k) for k in VARS}
R["live"] = dev.expandable_segments
