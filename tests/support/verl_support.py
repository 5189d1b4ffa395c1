"""verl's HYBRID rollout server (``vLLMHttpServer``) on the vLLM stand-in's ``AsyncLLM``, for the verl patches.

``verl_environment(release)`` is the ``PYTHONPATH`` and variables of a child that imports a real verl release
(``tests/support/envs.py``: ``.envs/verl-<v>`` plus the shared ``verl-deps``) with the stand-in imitating the
vLLM that release's code is written for (0.7.1 / 0.8.0: ``vllm<=0.12.0``; 0.9.0: ``>=0.18``, the checked-in
0.24.0). ``run_sleep(release, tmp_path)`` runs :data:`SCENARIO` there: a bare ``vLLMHttpServer``
(``cls.__new__`` plus what its sleep and wake read: ``node_rank`` 0, ``rollout_mode`` HYBRID, ``config.mtp``
(verl's own ``MtpConfig``), ``config.free_cache_engine``, ``model_config`` without LoRA) whose ``engine`` is the
stand-in's ``AsyncLLM`` (engine core in a forked process) with an MTP drafter; verl's own ``sleep`` then the
wake verl does (0.7.1: ``collective_rpc("wake_up", tags)`` as ``ServerAdapter.resume``; 0.8.0+:
``wake_up(tags)``), weights first, then kv_cache. Once with the shim off, then activated (after the import),
then with MTP off. Each phase reports the levels that reached the worker and the drafter's state.
"""
from __future__ import annotations

from tests.support.helpers import clean_env, last_json, run_python

VLLM_FOR = {"0.7.1": "0.12.0", "0.8.0": "0.12.0", "0.9.0": "0.24.0"}


def verl_environment(release: str):
    from tests.support.envs import verl_paths
    from tests.support.trl_support import fake_site

    vllm = VLLM_FOR[release]
    env = {"FAKEVLLM_VERSION": vllm, "VLLM_WORKER_MULTIPROC_METHOD": "fork", "RAY_USAGE_STATS_ENABLED": "0"}
    return [fake_site(vllm), *verl_paths(release)], env


def drafter_state(worker) -> dict:
    """Run in the worker (``collective_rpc`` callable): the drafter's fingerprint and origin, or None."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return {"fp": None, "origin": None}
    return {"fp": drafter.weights_fp(), "origin": drafter.weights_origin}


SCENARIO = r'''
import asyncio, json, os, sys
from types import SimpleNamespace
import verl.workers.rollout.vllm_rollout.vllm_async_server as vas
from verl.workers.config import MtpConfig
from verl.workers.rollout.replica import RolloutMode
from vllm import _fake
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from tests.support.verl_support import drafter_state

EVENTS = os.environ["FAKEVLLM_EVENTS"]

def levels():
    out = []
    with open(EVENTS) as f:
        for line in f:
            e = json.loads(line)
            if e["event"] == "worker_sleep":
                out.append(e["level"])
    return out

async def phase(mtp):
    kw = dict(model=os.environ["TEST_MODEL"], enable_sleep_mode=True, gpu_memory_utilization=0.2)
    if mtp:
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    srv = vas.vLLMHttpServer.__new__(vas.vLLMHttpServer)
    srv.node_rank, srv.rollout_mode, srv.engine = 0, RolloutMode.HYBRID, engine
    srv.config = SimpleNamespace(free_cache_engine=True, mtp=MtpConfig(enable=mtp, enable_rollout=mtp))
    srv.model_config = SimpleNamespace(lora_rank=0, lora={})
    open(EVENTS, "w").close()
    before = (await engine.collective_rpc(drafter_state))[0]
    await srv.sleep()
    for tags in (["weights"], ["kv_cache"]):
        if "tags" in vas.vLLMHttpServer.wake_up.__code__.co_varnames:
            await srv.wake_up(tags=tags)
        else:  # 0.7.1: ServerAdapter.resume -> the server's collective_rpc("wake_up")
            await srv.collective_rpc("wake_up", kwargs={"tags": tags})
    after = (await engine.collective_rpc(drafter_state))[0]
    engine.shutdown()
    return {"levels": levels(), "drafter_kept": before["fp"] is not None and after["fp"] == before["fp"],
            "drafter_origin": after["origin"]}

R = {"off": asyncio.run(phase(True))}
import shim
shim.activate()
from shim.engine import registry
R["decision"] = registry.decisions()["verl-mtp-sleep-level"].text()
R["on"] = asyncio.run(phase(True))
R["on_mtp_off"] = asyncio.run(phase(False))
print(json.dumps(R))
'''


def run_sleep(release: str, tmp_path) -> dict:
    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release)
    env = clean_env(**extra, FAKEVLLM_EVENTS=str(tmp_path / "events.jsonl"), TEST_MODEL=tiny_model(),
                    OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return last_json(run_python(SCENARIO, path=path, env=env, timeout=300))



