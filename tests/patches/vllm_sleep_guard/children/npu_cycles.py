# TEST_CYCLES sleep/wake/generate cycles in NPU mode (test_npu_sleep_leak.py): the device memory in use after
# each, its growth and what the caching allocator holds at the end. A stand_in body (after tests/support/children/stand_in_prelude.py).
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import R, dev, gen, new_llm

llm = new_llm()
used = []
for _ in range(int(os.environ["TEST_CYCLES"])):
    llm.sleep(level=1)
    llm.wake_up()
    gen(llm, ids=(3, 4))
    free, total = dev.mem_get_info()
    used.append(total - free)
R["growth_mb"] = (used[-1] - used[0]) / 2**20
R["cached_mb"] = (dev.cache_bytes + dev.stranded_bytes) / 2**20
