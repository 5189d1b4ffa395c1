# A KV cache released without a sleep (vLLM 0.31+ ``release_kv_cache_memory``: pause, then
# ``Executor.discard(("kv_cache",))`` -> ``Worker.discard``), then woken with ``wake_up(["kv_cache"])``, as verl
# and RL servers do between rollouts; then a sleep while only the KV cache is discarded. Twice: an ``AsyncLLM``
# whose engine core and worker run in a forked process (R["async"]), and an in-process ``LLM`` (R["llm"]). Each
# records the tokens of a rollout after each step, or the error of an engine over unmapped memory. A stand_in
# body (after tests/support/children/stand_in_prelude.py).
import asyncio
import os
from typing import TYPE_CHECKING

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import MODEL, SP, R, events, gen, new_llm

IDS = [3, 10, 11, 12]


def attempt(out, key, fn):
    try:
        out[key] = fn()
    except Exception as exc:
        out[key] = f"{type(exc).__name__}: {exc}"


async def async_run():
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enable_sleep_mode=True,
                                                       gpu_memory_utilization=0.3))
    out = {"core": engine.engine_core.engine_pid}

    async def rollout(key):
        try:
            async for o in engine.generate({"prompt_token_ids": IDS}, SP, key):
                out[key] = list(o.outputs[0].token_ids)
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    await rollout("first")
    await engine.sleep(1)  # a sleep and a wake: the worker's own check has a record from here on
    await engine.wake_up()
    await rollout("after_wake")
    await engine.sleep(0)  # the pause release_kv_cache_memory requires
    await engine.release_kv_cache_memory()
    await engine.wake_up(["kv_cache"])
    await rollout("after_discard")
    await engine.sleep(0)
    await engine.release_kv_cache_memory()
    await engine.sleep(1)  # only the KV cache asleep: vLLM 0.31+ sleeps the weights too
    await engine.wake_up()
    await rollout("after_sleep")
    engine.shutdown()
    return out


R["async"] = asyncio.run(async_run())

llm = new_llm()
R["llm"] = {"first": gen(llm)}
llm.sleep(level=1)
llm.wake_up()
llm.sleep(level=0)
llm.release_kv_cache_memory()
llm.wake_up(["kv_cache"])
attempt(R["llm"], "after_discard", lambda: gen(llm))
llm.sleep(level=0)
llm.release_kv_cache_memory()
R["llm"]["kv_wakes_before_sleep"] = len([e for e in events("allocator_wake_up") if e["tags"] == ["kv_cache"]])
llm.sleep(level=1)
R["llm"]["kv_wakes_at_sleep"] = len([e for e in events("allocator_wake_up") if e["tags"] == ["kv_cache"]])
llm.wake_up()
attempt(R["llm"], "after_sleep", lambda: gen(llm))

# A KV cache released where the shim's wrappers do not see it (the allocator's own discard, as a sleep-mode
# backend plugin may do it), vLLM's executor told: its wake of the KV cache reaches the worker all the same.
executor = llm.llm_engine.model_executor
llm.sleep(level=0)
executor.driver_worker.worker._allocator().discard(("kv_cache",))
executor.sleeping_tags.add("kv_cache")
executor.is_sleeping = True
executor.wake_up(["kv_cache"])
llm.wake_up(["scheduling"])
attempt(R["llm"], "after_unseen_discard", lambda: gen(llm))
