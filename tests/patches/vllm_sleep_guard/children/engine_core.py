# The trainer process of test_engine_core.py: AsyncLLM engines whose engine core runs in its own process
# (spawn or fork), each with sleep/wake cycles (the second wakes the weights, then both tags) and one rollout
# after them (R["after"]: its tokens or its error), then (TEST_IN_PROCESS=1) an in-process LLM with 2 cycles; prints
# R (its pid, each engine core's pid, the first tokens). TEST_ENGINES: the engines, comma-separated
# ("spawn", "fork", "nosleep-fork": built without sleep mode). TEST_AUTO=1: the shim from `import shim.auto` in
# this program, and R["spawned_active"]: whether a bare spawned child activates with the PYTHONPATH found before
# the import and with the one after it.
import asyncio
import json
import os

if os.environ.get("TEST_AUTO"):  # the shim from the script alone (no `python -m shim`)
    BEFORE = os.environ.get("PYTHONPATH", "")
    import shim.auto  # noqa: F401
    AFTER = os.environ.get("PYTHONPATH", "")

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

MODEL = os.environ["TEST_MODEL"]
SP = SamplingParams(max_tokens=3, temperature=0.0)
R = {"parent": os.getpid(), "core": {}}

async def cycles(name, sleep_mode, n):
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = name.split("-")[-1]  # read at each engine core's start
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enable_sleep_mode=sleep_mode,
                                                       gpu_memory_utilization=0.5))
    R["core"][name] = engine.engine_core.engine_pid
    for i in range(n):
        async for out in engine.generate({"prompt_token_ids": [3, 10, 11]}, SP, "r0"):
            R.setdefault("tokens", list(out.outputs[0].token_ids))
        await engine.sleep(1)
        if i == 1:  # the weights woken for a push, then both tags for the rollout (vLLM drops that wake)
            await engine.wake_up(["weights"])
            await engine.wake_up(["weights", "kv_cache"])
        else:
            await engine.wake_up()
    try:  # a rollout after the last wake: tokens, or the error of an engine left asleep
        async for out in engine.generate({"prompt_token_ids": [3, 10, 11]}, SP, "r1"):
            R.setdefault("after", {})[name] = list(out.outputs[0].token_ids)
    except Exception as exc:
        R.setdefault("after", {})[name] = f"{type(exc).__name__}: {exc}"
    engine.shutdown()

async def main():
    for name in os.environ["TEST_ENGINES"].split(","):
        await cycles(name, not name.startswith("nosleep"), 1 if name.startswith("nosleep") else 2)

if os.environ.get("TEST_AUTO"):  # R["spawned_active"]: a bare spawned child, PYTHONPATH as the import found it / left it
    import multiprocessing

    R["spawned_active"] = {}
    for label, value in (("before", BEFORE), ("after", AFTER)):
        os.environ["PYTHONPATH"] = value
        child = multiprocessing.get_context("spawn").Process(
            target=exec, args=("import sys, shim; sys.exit(0 if shim.is_active() else 3)",))
        child.start()
        child.join()
        R["spawned_active"][label] = child.exitcode == 0
    os.environ["PYTHONPATH"] = AFTER
asyncio.run(main())
if os.environ.get("TEST_IN_PROCESS"):
    llm = LLM(model=MODEL, enable_sleep_mode=True, gpu_memory_utilization=0.5,
              distributed_executor_backend="external_launcher")
    for _ in range(2):
        llm.generate([{"prompt_token_ids": [3, 10, 11]}], SP, use_tqdm=False)
        llm.sleep(level=1)
        llm.wake_up()
print(json.dumps(R))
