# The user's allocator options across a sleep-mode engine's build, a level-1 sleep and a wake
# (test_alloc_options.py). A stand_in body (after tests/support/children/stand_in_prelude.py).
# Reads the live allocator settings of the stand-in's device, whether the sleep freed the pool, and (shim on)
# the guard records' decisions; TEST_FORCE_GUARD=1 then runs the guard once as if vLLM did not cover the
# routes, to show what its live write does to the user's options.
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, dev, events, gen, new_llm

llm = new_llm()
gen(llm)
R["after_build"] = dict(dev.settings)
llm.sleep(level=1)
llm.wake_up()
gen(llm)
R["after_wake"] = dict(dev.settings)
R["in_pool"] = events("load_model")[-1]["in_pool"]
R["freed_gib"] = events("worker_sleep")[-1]["freed_bytes"] / 2**30
if os.environ.get("TEST_SHIM") == "1":
    from shim.engine import registry

    decisions = registry.decisions()
    R["decisions"] = {pid: decisions[pid].text() for pid in
                      ("vllm-sleep-guard", "vllm-worker-sleep-guard", "vllm-ascend-worker-sleep-guard") if pid in decisions}
    if os.environ.get("TEST_FORCE_GUARD") == "1":
        from shim.vllm.sleep import alloc_guard, memory

        probe = memory.probe()
        getattr(alloc_guard, "_covered", {})[probe.name] = None
        with alloc_guard.expandable_segments_off(probe):
            pass
        R["after_forced_guard"] = dict(dev.settings)
