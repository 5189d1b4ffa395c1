# TEST_CYCLES sleep/wake/generate cycles of a stand-in engine under shim.auto (test_log_volume.py run): what
# the shim logs over a long run, on stderr.
import os

import shim.auto  # noqa: F401  (before vLLM)

# isort: split
from vllm import LLM, SamplingParams

llm = LLM(model=os.environ["TEST_MODEL"], enable_sleep_mode=True, gpu_memory_utilization=0.5,
          distributed_executor_backend="external_launcher")
sp = SamplingParams(max_tokens=2, temperature=0.0)
for _ in range(int(os.environ["TEST_CYCLES"])):
    llm.sleep(level=1)
    llm.wake_up()
    llm.generate([{"prompt_token_ids": [3, 10, 11]}], sp, use_tqdm=False)
print("done")
