# The first part of the sleep-verdict bodies (test_sleep_verdict.py): a device that keeps the pages of some
# pool allocations at a sleep (KEEP: their labels, "*": all), and pool_alloc to make one.
# A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py). Another body follows it.
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import dev

import vllm.device_allocator.cumem as cumem
from vllm.device_allocator.cumem import CuMemAllocator

_unmap = cumem.unmap_and_release
KEEP = set()   # labels whose pages the device keeps at a sleep ("*": every allocation)
def unmap_and_release(handle):
    a = dev.allocations.get(handle[2])
    if a is not None and ("*" in KEEP or a.label in KEEP):
        return  # the pool let go of its handle; the physical pages stay in use
    _unmap(handle)
cumem.unmap_and_release = unmap_and_release
def pool_alloc(nbytes, label):
    with CuMemAllocator.get_instance().use_memory_pool(tag="kv_cache"):
        return dev.allocate(nbytes, label=label)
