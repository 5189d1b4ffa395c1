# The first part of every stand-in self-test (tests/fakevllm/test_fake.py ``run``): an engine factory and
# readings of the stand-in; the model directory is sys.argv[1]. The test's body follows it in the same
# program, then the print of RESULT.
import json  # noqa: F401  (the closing print)
import os  # noqa: F401  (for the body)
import sys

import torch
import vllm
from vllm import LLM, SamplingParams
from vllm._fake import EVENTS, fingerprint  # noqa: F401  (for the body)

dev = vllm._fake.device.DEVICE
mem = torch.npu if vllm._fake.DEVICE_TYPE == "npu" else torch.cuda
MODEL = sys.argv[1]
def new_llm(**kw):
    kw.setdefault("enable_sleep_mode", True)
    kw.setdefault("gpu_memory_utilization", 0.5)
    kw.setdefault("distributed_executor_backend", "external_launcher")
    return LLM(model=MODEL, **kw)
def wfp(llm):
    return llm.llm_engine.model_executor.driver_worker.model_runner.weights_fp()
def model(llm):
    return llm.llm_engine.model_executor.driver_worker.model_runner.model
SP = SamplingParams(max_tokens=6, temperature=0.0)
PROMPT = [{"prompt_token_ids": [3, 10, 11, 12]}]
def toks(llm):
    return llm.generate(PROMPT, SP, use_tqdm=False)[0].outputs[0].token_ids
RESULT = {}
