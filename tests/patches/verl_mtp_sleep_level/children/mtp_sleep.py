# verl's vLLMHttpServer sleep and per-tag wakes on the stand-in's AsyncLLM with an MTP drafter
# (tests/support/verl_support.py run_sleep, test_mtp_sleep_level.py): the worker's sleep levels and whether the
# drafter's weights survive, without the shim, with it, and with it and MTP off; printed as JSON.
import asyncio
import json
import os
from types import SimpleNamespace

import verl.workers.rollout.vllm_rollout.vllm_async_server as vas
from verl.workers.config import MtpConfig
from verl.workers.rollout.replica import RolloutMode
from vllm import _fake  # noqa: F401  (as the inline program imported it)
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
