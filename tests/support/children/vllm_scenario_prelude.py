# The first part of every vLLM sleep scenario (tests/support/vllm_scenario.py ``scenario``): an engine
# factory and device readings on the stand-in (tests/fakevllm). The scenario's body follows it in the same
# program, then ``print(json.dumps(R))``.
import json  # noqa: F401  (the closing print)
import os
import sys  # noqa: F401  (for the body)

if os.environ.get("TEST_SHIM") == "1":
    import shim.auto  # noqa: F401
import torch
import vllm
from vllm import LLM, SamplingParams

dev = vllm._fake.device.DEVICE
mem = torch.npu if vllm._fake.DEVICE_TYPE == "npu" else torch.cuda
MODEL = os.environ["TEST_MODEL"]
R = {}
def new_llm(**kw):
    kw.setdefault("enable_sleep_mode", True)
    kw.setdefault("gpu_memory_utilization", 0.5)
    kw.setdefault("distributed_executor_backend", "external_launcher")
    return LLM(model=MODEL, **kw)
def free():
    return dev.mem_get_info()[0]
def tracked():
    if vllm._fake.DEVICE_TYPE == "npu":
        from vllm_ascend.device_allocator.camem import CaMemAllocator as A
    else:
        from vllm.device_allocator.cumem import CuMemAllocator as A
    return A.instance.get_current_usage() if A.instance is not None else 0
SP = SamplingParams(max_tokens=3, temperature=0.0)
def gen(llm):
    return llm.generate([{"prompt_token_ids": [3, 10, 11]}], SP, use_tqdm=False)[0].outputs[0].token_ids
