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

from tests.support.helpers import REPO, clean_env, last_json, run_python

VLLM_FOR = {"0.7.1": "0.12.0", "0.8.0": "0.12.0", "0.9.0": "0.24.0", "0.9.1": "0.24.0"}


def verl_environment(release: str, vllm: "str | None" = None):
    """``(path, env)`` of a child importing verl ``release`` on the stand-in imitating ``vllm`` (default:
    :data:`VLLM_FOR`)."""
    from tests.support.envs import verl_paths
    from tests.support.trl_support import fake_site

    vllm = vllm or VLLM_FOR[release]
    env = {"FAKEVLLM_VERSION": vllm, "VLLM_WORKER_MULTIPROC_METHOD": "fork", "RAY_USAGE_STATS_ENABLED": "0"}
    return [fake_site(vllm), *verl_paths(release)], env


def drafter_state(worker) -> dict:
    """Run in the worker (``collective_rpc`` callable): the drafter's fingerprint and origin, or None."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return {"fp": None, "origin": None}
    return {"fp": drafter.weights_fp(), "origin": drafter.weights_origin}


SCENARIO = REPO / "tests" / "patches" / "verl_mtp_sleep_level" / "children" / "mtp_sleep.py"


def run_sleep(release: str, tmp_path) -> dict:
    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release)
    env = clean_env(**extra, FAKEVLLM_EVENTS=str(tmp_path / "events.jsonl"), TEST_MODEL=tiny_model(),
                    OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return last_json(run_python(SCENARIO.read_text(), path=path, env=env, timeout=300))


def push_weights(worker) -> str:
    """Run in the worker (``collective_rpc`` callable): a trainer step's weights written into the engine the way
    verl's worker extension does (``update_weights_from_ipc``: ``model_runner.model.load_weights``); returns the
    new weights' fingerprint."""
    runner = worker.model_runner
    runner.model.load_weights([(name, param.detach() + 0.01) for name, param in runner.model.named_parameters()])
    return runner.weights_fp()


CACHE_SCENARIO = r'''
import asyncio, json, os, sys
from types import SimpleNamespace
import torch
import verl.workers.rollout.vllm_rollout.vllm_async_server as vas
from verl.workers.rollout.replica import RolloutMode
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from tests.support.verl_support import push_weights

EVENTS = os.environ["FAKEVLLM_EVENTS"]
FLOWS = json.loads(os.environ["FLOWS"])
IMAGE = torch.arange(48, dtype=torch.float32).reshape(3, 4, 4)  # the image every step's prompt reuses


class Config(SimpleNamespace):  # verl's RolloutConfig reads as attributes and .get
    def get(self, key, default=None):
        return getattr(self, key, default)


def events():
    with open(EVENTS) as f:
        return [json.loads(line) for line in f]


async def wake(srv, tags):
    if "tags" in vas.vLLMHttpServer.wake_up.__code__.co_varnames:
        await srv.wake_up(tags=tags)
    else:  # 0.7.1: ServerAdapter.resume -> the server's collective_rpc("wake_up")
        await srv.collective_rpc("wake_up", kwargs={"tags": tags})


async def phase(sleep):
    """verl's HYBRID loop, twice over one image: rollout, (sleep: verl's sleep, then the weights wake),
    the push and verl's clear_kv_cache (ServerAdapter.update_weights), (sleep: the kv_cache wake), rollout."""
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=os.environ["TEST_MODEL"], enable_sleep_mode=True,
                                                       gpu_memory_utilization=0.2))
    srv = vas.vLLMHttpServer.__new__(vas.vLLMHttpServer)
    srv.node_rank, srv.replica_rank, srv.rollout_mode, srv.engine = 0, 0, RolloutMode.HYBRID, engine
    srv.global_steps, srv._disaggregation_role, srv._pd_decode_peers = None, None, None  # 0.9.0: no PD split
    srv.config = Config(free_cache_engine=sleep, max_model_len=128, prompt_length=16, response_length=2, mtp=None,
                        enable_rollout_routing_replay=False, full_determinism=False)
    srv.model_config = SimpleNamespace(lora_rank=0, lora={}, processor=None)
    open(EVENTS, "w").close()
    await srv.generate([1, 2, 3, 4], {"max_tokens": 2}, "step-1", image_data=[IMAGE])
    await srv.sleep()  # verl returns at once when free_cache_engine is off
    if sleep:
        await wake(srv, ["weights"])
    mark = len(events())
    await engine.collective_rpc(push_weights)
    await srv.clear_kv_cache()
    after_push = events()[mark:]
    if sleep:
        await wake(srv, ["kv_cache"])
    await srv.generate([5, 6, 7, 8], {"max_tokens": 2}, "step-2", image_data=[IMAGE])
    engine.shutdown()
    gens = [e for e in events() if e["event"] == "generate"]
    resets = [e for e in events() if e["event"] == "reset_encoder_cache"]
    return {"stale_encoder_hits": gens[-1]["stale_encoder_hits"], "encoder_hits": gens[-1]["encoder_hits"],
            "encoder_resets": [e["where"] for e in resets],
            "push_resets": [e["event"] for e in after_push if e["event"] in ("reset_mm_cache", "reset_encoder_cache")]}


R = {"off": {flow: asyncio.run(phase(flow == "sleep")) for flow in FLOWS}}
import shim
shim.activate()
from shim.engine import registry
from shim.patches import verl_vlm_encoder_cache
R["decision"] = registry.decisions()["verl-vlm-encoder-cache"].text()
R["probe"] = verl_vlm_encoder_cache.probe(vas)
R["on"] = {flow: asyncio.run(phase(flow == "sleep")) for flow in FLOWS}
print(json.dumps(R))
'''


def run_caches(release: str, vllm: str, flows: list, tmp_path) -> tuple:
    """:data:`CACHE_SCENARIO` on verl ``release`` and the stand-in imitating ``vllm``; ``flows``: ``"sleep"``
    (``free_cache_engine`` on: verl's sleep and wakes around the push) and/or ``"awake"`` (off: the push alone).
    Returns ``(result, stderr)``."""
    import json

    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release, vllm)
    env = clean_env(**extra, FAKEVLLM_EVENTS=str(tmp_path / "events.jsonl"), TEST_MODEL=tiny_model(),
                    FLOWS=json.dumps(flows), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                    HF_HUB_OFFLINE="1")
    proc = run_python(CACHE_SCENARIO, path=path, env=env, timeout=300)
    return last_json(proc), proc.stderr
