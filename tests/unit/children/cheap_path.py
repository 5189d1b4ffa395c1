# The verdict's cheap path (test_sleep_verdict.py test_cheap_path_*): CYCLES sleep/wake cycles, the device
# readings of each; GROW_AT: the cycle the pool grows at, FAULT_AT: from which the device keeps every page,
# LEVEL_AT_<i>: cycle i's sleep level. After held.py. A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py).
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, free, new_llm
    from tests.unit.children.held import KEEP, pool_alloc

from shim.vllm.sleep import memory

reads = []
_read = memory.Probe.mem_get_info
def counted(self):
    reads.append(1)
    return _read(self)
memory.Probe.mem_get_info = counted
llm = new_llm()
R["cycles"] = []
FAULT_AT = int(os.environ.get("FAULT_AT", "0"))
for i in range(1, int(os.environ["CYCLES"]) + 1):
    if i == int(os.environ.get("GROW_AT", "0")):
        pool_alloc(1 << 30, "grown")  # the pool tracks 1 GiB more than at the last reading
    if i == FAULT_AT:
        KEEP.add("*")  # from here the device keeps every page the pool releases
    n = len(reads)
    a = free(); llm.sleep(level=int(os.environ.get("LEVEL_AT_" + str(i), "1"))); freed = free() - a
    llm.wake_up()
    R["cycles"].append({"freed": freed, "reads": len(reads) - n})
