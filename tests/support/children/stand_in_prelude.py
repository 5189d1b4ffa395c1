# The first part of every stand-in snippet (tests/support/stand_in.py ``run``): an engine factory and
# readings of the stand-in (tests/fakevllm). The snippet's body follows it in the same program, then
# ``print(json.dumps(R))``.
import json  # noqa: F401  (the closing print)
import os
import sys  # noqa: F401  (for the body)

if os.environ.get("TEST_SHIM") == "1":
    import shim.auto  # noqa: F401
import torch  # noqa: F401  (for the body)
import vllm
from vllm import LLM, SamplingParams

dev = vllm._fake.device.DEVICE
MODEL = os.environ["TEST_MODEL"]
R = {}
def new_llm(**kw):
    kw.setdefault("enable_sleep_mode", True)
    kw.setdefault("gpu_memory_utilization", 0.3)
    kw.setdefault("distributed_executor_backend", "external_launcher")
    return LLM(model=MODEL, **kw)
def runner(llm):
    return llm.llm_engine.model_executor.driver_worker.model_runner
def events(name):
    return [e for e in vllm._fake.EVENTS if e["event"] == name]
SP = SamplingParams(max_tokens=4, temperature=0.0)
def gen(llm, ids=(3, 10, 11, 12)):
    return list(llm.generate([{"prompt_token_ids": list(ids)}], SP, use_tqdm=False)[0].outputs[0].token_ids)
