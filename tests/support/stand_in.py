"""Run a snippet on the vLLM stand-in (tests/fakevllm) in a fresh interpreter, shim on or off.

Shared by the tests of the caches / buffers / NPU-leak patches. ``site(version, device)`` is the
stand-in's site dir for another vLLM version or NPU mode (with vllm-ascend metadata).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import tempfile
import textwrap

from tests.support.helpers import REPO, clean_env, last_json, run_python, stand_in_site_dir

FAKEVLLM = REPO / "tests" / "fakevllm"

PRELUDE = """
import json, os, sys
if os.environ.get("TEST_SHIM") == "1":
    import shim.auto
import torch, vllm
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
"""


@functools.lru_cache(maxsize=None)
def site(version: str = "0.24.0", device: str = "cuda", ascend: str = "") -> str:
    """Site dir imitating vLLM ``version`` on ``device`` (NPU: vllm-ascend ``ascend`` metadata)."""
    target = stand_in_site_dir(f"fakevllm-{version}-{device}{'-' + ascend if ascend else ''}")
    if not target.exists():
        spec = importlib.util.spec_from_file_location("fakevllm_make_site", FAKEVLLM / "make_site.py")
        make_site = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(make_site)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp")
        make_site.make_site(tmp, version=version, device=device, ascend_version=ascend or None)
        try:
            os.rename(tmp, target)
        except OSError:  # another worker won the race
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def run(model_dir, body: str, shim: bool, version: str = "0.24.0", device: str = "cuda", ascend: str = "",
        check: bool = True, **env):
    """(result dict or None, process) of ``PRELUDE + body`` printing ``R`` as its last line."""
    base = clean_env()
    for k in list(base):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) or k in ("RANK", "LOCAL_RANK"):
            del base[k]
    base.update(VLLM_LOGGING_LEVEL="ERROR", TEST_MODEL=str(model_dir), TEST_SHIM="1" if shim else "0",
                FAKEVLLM_VERSION=version, FAKEVLLM_DEVICE=device, OMP_NUM_THREADS="1")
    if ascend:
        base["FAKEVLLM_ASCEND_VERSION"] = ascend
    base.update({k: str(v) for k, v in env.items()})
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(R))\n"
    path = [site(version, device, ascend)]
    proc = run_python(code, path=path, env=base, check=check)
    return (last_json(proc) if proc.returncode == 0 else None), proc
