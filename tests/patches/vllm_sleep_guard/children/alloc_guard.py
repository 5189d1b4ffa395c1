# The allocator guard alone, no vLLM (test_sleep_check.py test_alloc_guard_restores_exactly): the variables
# and the live setting inside and after expandable_segments_off, printed as JSON.
import json
import os

from shim.vllm.sleep import alloc_guard


class Mem:
    def __init__(self): self.calls = []
    def _set_allocator_settings(self, s): self.calls.append(s)
class Probe:
    name = "npu"
    def __init__(self): self.module = type("M", (), {})(); self.module.memory = Mem()
    def set_allocator_settings(self, s): self.module.memory._set_allocator_settings(s); return True
p = Probe()
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "max_split_size_mb:128,expandable_segments:True"
os.environ["PYTORCH_NPU_ALLOC_CONF"] = " expandable_segments:True ,garbage_collection_threshold:0.6"
os.environ["PYTORCH_ALLOC_CONF"] = "expandable_segments:False"
before = {k: os.environ.get(k) for k in alloc_guard.ENV_VARS}
with alloc_guard.expandable_segments_off(p):
    inside = {k: os.environ.get(k) for k in alloc_guard.ENV_VARS}
    with alloc_guard.expandable_segments_off(p):   # re-entrant: nothing more happens
        pass
    nested_calls = list(p.module.memory.calls)
after = {k: os.environ.get(k) for k in alloc_guard.ENV_VARS}
alloc_guard.track_live_setting(p)
p.module.memory._set_allocator_settings("expandable_segments:False")  # the user turns it off live
with alloc_guard.expandable_segments_off(p):
    pass
print(json.dumps({"before": before, "inside": inside, "after": after, "nested": nested_calls,
                  "calls": p.module.memory.calls}))
