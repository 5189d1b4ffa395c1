# A level-2 sleep of an engine with an MTP drafter, the weights wake, a push of the TARGET's parameters only
# (as ms-swift 4.6.0's does), the kv_cache wake (test_level2_drafter.py). TEST_ENGINE: "llm" (vllm.LLM) or
# "async" (AsyncLLM.from_engine_args(AsyncEngineArgs(...)), engine core in a forked process). TEST_PRESERVE:
# unset (not passed), "[]" (an explicit empty list) or a comma list. TEST_SPEC=0: no speculative config.
# A stand_in body (after tests/support/children/stand_in_prelude.py).
import asyncio
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined by the prelude this body follows
    from tests.support.children.stand_in_prelude import MODEL, R, gen, new_llm

from tests.support.verl_support import drafter_state

kw = {}
if os.environ.get("TEST_SPEC", "1") == "1":
    kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
if "TEST_PRESERVE" in os.environ:
    kw["sleep_preserve_parameter_names"] = [] if os.environ["TEST_PRESERVE"] == "[]" else \
        os.environ["TEST_PRESERVE"].split(",")


def keep_target(worker):
    """The trainer's copy of the policy: the target model's parameters before the sleep (and, for a trainer that
    pushes its drafter too, the drafter's own, each + 0.01)."""
    worker.test_policy = [(n, p.detach().clone()) for n, p in worker.model_runner.model.named_parameters()]
    draft = worker.model_runner.drafter.model if hasattr(worker.model_runner, "drafter") else None
    worker.test_draft = [(n, p.detach() + 0.01) for n, p in draft.named_parameters()] if draft is not None else []


def push_target(worker):
    """The trainer's push: the target model's parameters (as they were), raw load_weights; the drafter's only
    where TEST_PUSH_DRAFTER=1 (then its fingerprint after that push is returned)."""
    worker.model_runner.model.load_weights(worker.test_policy)
    if os.environ.get("TEST_PUSH_DRAFTER") == "1":
        worker.model_runner.drafter.model.load_weights(worker.test_draft)
        return worker.model_runner.drafter.weights_fp()
    return None


def warned(worker):
    from vllm.v1.worker import gpu_worker

    return bool(getattr(gpu_worker, "_warned_draft", ()))


if os.environ.get("TEST_ENGINE", "llm") == "llm":
    llm = new_llm(**kw)
    worker = llm.llm_engine.model_executor.driver_worker
    R["preserve"] = list(llm.llm_engine.model_config.sleep_preserve_parameter_names or [])
    before, out = drafter_state(worker), gen(llm)
    keep_target(worker)
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    pushed = push_target(worker)
    llm.wake_up(tags=["kv_cache"])
    after = drafter_state(worker)
    R["pushed_fp"] = pushed
    R["same_output"] = gen(llm) == out
    R["warned"] = warned(worker)
else:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main():
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enable_sleep_mode=True,
                                                           gpu_memory_utilization=0.3, **kw))
        R["preserve"] = list(engine.model_config.sleep_preserve_parameter_names or [])
        first = (await engine.collective_rpc(drafter_state))[0]
        await engine.collective_rpc(keep_target)
        await engine.sleep(level=2)
        await engine.wake_up(tags=["weights"])
        R["pushed_fp"] = (await engine.collective_rpc(push_target))[0]
        await engine.wake_up(tags=["kv_cache"])
        last = (await engine.collective_rpc(drafter_state))[0]
        R["warned"] = (await engine.collective_rpc(warned))[0]
        engine.shutdown()
        return first, last

    before, after = asyncio.run(main())
R["drafter_kept"] = before["fp"] is not None and after["fp"] == before["fp"]
R["drafter_origin"] = after["origin"]
R["drafter_is_pushed"] = R["pushed_fp"] is not None and after["fp"] == R["pushed_fp"]
if os.environ.get("TEST_SHIM") == "1":
    from shim.engine import registry

    R["decision"] = registry.decisions()["vllm-level2-drafter"].text()
