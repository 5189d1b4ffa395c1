# The trainer side of test_openrlhf_reach.py: OpenRLHF's real rollout engine (RolloutRayActor, the class under its
# @ray.remote) on the vLLM stand-in, driven by OpenRLHF's own functions in the order its PPO trainer calls them; prints
# R (this process's pid, the engine core's, the worker's status rows there and here, the tokens).
#
# No Ray cluster: ``create_vllm_engines`` builds the actor through ``RolloutRayActor.options(...).remote(**kwargs)``
# and ``batch_vllm_engine_call`` calls ``method.remote(...)`` then ``ray.get``. Here ``options().remote`` constructs
# the undecorated class (``__ray_actor_class__``; its ``__init__`` is a coroutine, as Ray's async actors allow) on
# one event loop in a thread (a Ray async actor runs its methods on its event loop), ``method.remote`` schedules the
# coroutine there and ``ray.get`` waits for it. Everything else is OpenRLHF 0.11.2's code.
import asyncio
import concurrent.futures
import json
import os
import threading

import openrlhf.trainer.ray.vllm_engine as ve
import ray
import vllm

from tests.support.openrlhf_support import worker_rows

MODEL = os.environ["TEST_MODEL"]
ACTOR_CLASS = ve.RolloutRayActor.__ray_actor_class__  # the class @ray.remote decorated
LOOP = asyncio.new_event_loop()
threading.Thread(target=LOOP.run_forever, daemon=True).start()
BUILT = []


def on_loop(value):
    """A coroutine scheduled on the actor's loop; a plain method's result as a resolved future."""
    if asyncio.iscoroutine(value):
        return asyncio.run_coroutine_threadsafe(value, LOOP)
    future = concurrent.futures.Future()
    future.set_result(value)
    return future


class Method:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def remote(self, *args, **kwargs):
        return on_loop(getattr(self.actor, self.name)(*args, **kwargs))


class Handle:
    def __init__(self, actor):
        self.actor = actor

    def __getattr__(self, name):
        return Method(self.actor, name)


class Options:
    def __init__(self, **options):
        self.options = options

    def remote(self, **kwargs):
        actor = object.__new__(ACTOR_CLASS)
        on_loop(ACTOR_CLASS.__init__(actor, **kwargs)).result()
        BUILT.append({"options": sorted(self.options), "kwargs": {k: kwargs[k] for k in
                      ("distributed_executor_backend", "enable_sleep_mode", "worker_extension_cls",
                       "enable_prefix_caching")}})
        return Handle(actor)


class LocalActorClass:
    def options(self, **options):
        return Options(**options)


ve.RolloutRayActor = LocalActorClass()
ray.get = lambda refs: [r.result() for r in refs] if isinstance(refs, list) else refs.result()

# openrlhf/cli/train_ppo_ray.py: colocated (hybrid engine: a shared placement group), sleep mode on
engines = ve.create_vllm_engines(1, 1, MODEL, 0, False, True, True, 128, shared_pg=object(),
                                 gpu_memory_utilization=0.5, vllm_enable_sleep=True)  # ends with its first sleep
actor = engines[0].actor
R = {"parent": os.getpid(), "core": actor.llm.engine_core.engine_pid, "engine_class": type(actor.llm).__name__,
     "built": BUILT, "sleeping_after_create": on_loop(actor.llm.is_sleeping()).result()}
SP = vllm.SamplingParams(max_tokens=3, temperature=0.0)
for step in range(2):
    # PPOTrainer.broadcast_to_vllm: the weights woken for the sync; PolicyModelActor.broadcast_to_vllm resets the
    # prefix cache (enable_prefix_caching) around the per-parameter update_weight calls (NCCL: not run here)
    ve.batch_vllm_engine_call(engines, "wake_up", tags=["weights"])
    ray.get([engines[0].reset_prefix_cache.remote()])
    # SamplesGenerator.generate_samples: wake (both tags, one at a time), generate, sleep
    ve.batch_vllm_engine_call(engines, "wake_up")
    out = ray.get([engines[0].generate.remote([3, 10, 11], SP)])[0]
    R.setdefault("tokens", list(out.outputs[0].token_ids))
    ve.batch_vllm_engine_call(engines, "sleep")
R["worker"] = on_loop(actor.llm.collective_rpc(worker_rows)).result()[0]  # in the engine core's worker
R["here"] = worker_rows(None)["rows"]  # the same rows in this (the actor's) process
actor.llm.shutdown()
print(json.dumps(R))
