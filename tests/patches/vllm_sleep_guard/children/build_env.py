# What the allocator variables read inside the engine build (test_sleep_check.py
# test_every_env_route_off_inside_the_build): in this process and in a process started there.
# A vllm_scenario body (after tests/support/children/vllm_scenario_prelude.py).
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.vllm_scenario_prelude import R, dev, new_llm

from vllm.v1.worker.gpu_worker import Worker

VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
_load = Worker.load_model
def load_model(self):  # runs inside the engine build, in CuMemAllocator.use_memory_pool("weights")
    R["inside"] = {k: os.environ.get(k) for k in VARS}
    R["live_inside"] = dev.expandable_segments
    code = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (VARS,)
    R["child"] = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True).stdout)
    return _load(self)
Worker.load_model = load_model
llm = new_llm()
R["after"] = {k: os.environ.get(k) for k in VARS}
