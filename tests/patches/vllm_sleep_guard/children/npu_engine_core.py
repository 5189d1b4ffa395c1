# An AsyncLLM in NPU mode whose engine core (and vllm-ascend's NPUWorker) runs in a forked process:
# 2 generate/sleep/wake cycles (test_npu_engine_core.py). A stand_in body (after
# tests/support/children/stand_in_prelude.py); R: this process's pid and the engine core's.
import asyncio
import os
from typing import TYPE_CHECKING

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import MODEL, SP, R

os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"


async def cycles():
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enable_sleep_mode=True,
                                                       gpu_memory_utilization=0.5))
    R["core"] = engine.engine_core.engine_pid
    for _ in range(2):
        async for _out in engine.generate({"prompt_token_ids": [3, 10, 11]}, SP, "r0"):
            pass
        await engine.sleep(1)
        await engine.wake_up()
    engine.shutdown()


asyncio.run(cycles())
R["parent"] = os.getpid()
