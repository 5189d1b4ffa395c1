"""The vLLM sleep scenarios: a child program on the stand-in (tests/fakevllm), shim on or off.

``scenario(model_dir, body, shim)`` runs ``PRELUDE`` (an engine factory and device readings) plus
``body`` in a fresh interpreter and returns the child's ``R`` dict; used by the sleep-check, verdict
and fault tests.
"""
from __future__ import annotations

import textwrap

from tests.support.helpers import REPO, clean_env, last_json, run_python

FAKEVLLM = REPO / "tests" / "fakevllm"
GiB = 1 << 30
VALUE = "max_split_size_mb:128,expandable_segments:True"


PRELUDE = """
import json, os, sys
if os.environ.get("TEST_SHIM") == "1":
    import shim.auto
import torch, vllm
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
"""


def scenario(model_dir, body: str, shim: bool, check: bool = True, **env):
    base = clean_env()
    for k in list(base):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) or k in ("RANK", "LOCAL_RANK"):
            del base[k]
    base.update(VLLM_LOGGING_LEVEL="ERROR", TEST_MODEL=model_dir, TEST_SHIM="1" if shim else "0")
    base.update({k: str(v) for k, v in env.items()})
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    proc = run_python(code, path=[FAKEVLLM], env=base, check=check)
    return (last_json(proc) if proc.returncode == 0 else None), proc
