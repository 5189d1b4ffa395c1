# What a level-1 sleep gives back to the device, with the allocator set by the test's case
# (test_fake.py test_bypass): TEST_SETUP runs before the first device use (where the allocator parses its
# env var), TEST_AFTER after it (one-line snippets of the case). A test_fake.py body (after children/prelude.py).
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from children.prelude import RESULT, dev, mem, new_llm

exec(os.environ.get("TEST_SETUP", ""))
mem.mem_get_info()            # first device use: allocator parses its env var
exec(os.environ.get("TEST_AFTER", ""))
llm = new_llm()
f0 = mem.mem_get_info()[0]
llm.sleep(level=1)
RESULT["freed_gib"] = (mem.mem_get_info()[0] - f0) / 2**30
RESULT["pool"] = llm.llm_engine.model_executor.driver_worker._allocator().get_current_usage()
RESULT["expandable"] = dev.expandable_segments
