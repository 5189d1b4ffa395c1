"""Child (run under ``python -m shim``): verl's own weight update with its ``vLLMHttpServer`` as a REAL Ray actor.

A local Ray cluster (loopback, 1 CPU, no dashboard, its own temp dir, ports Ray picks) is started here and shut
down in a ``finally``. ``ray.remote(StandInServer)`` (``tests/support/verl_ray.py``: verl's class, the stand-in's
engine) named ``vllm_server_0_0``, as verl 0.9.1's ``vLLMReplica`` names it; verl's ``ServerAdapter``
(this process: the trainer rank) finds it with ``ray.get_actor`` and runs ``update_weights``:
``collective_rpc.remote("update_weights_from_ipc")`` -> verl's ``BucketedWeightSender`` (ZMQ, shared memory) ->
the stand-in's worker (in the engine-core process forked from the actor) -> ``clear_kv_cache.remote()``.
``sys.argv[1]``: JSON list of phases ``{"name", "drop": a tensor the engine's load leaves out, "env": variables
set for it in this process}``; each is one trainer step (every weight + 0.01) and one ``update_weights``. Prints
``{"decisions": the shim's verify-weights decisions in the actor and its engine's worker, phase: {"differs": the
engine tensors that are not the trainer's (read in the worker), "counts", "warnings", "raised"}}``.
"""
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from types import SimpleNamespace

import ray
import torch
import verl.workers.rollout.vllm_rollout.vllm_rollout as vro
from transformers import AutoModelForCausalLM

from tests.support import verl_ray

MODEL = os.environ["TEST_MODEL"]


class Config(SimpleNamespace):  # verl's RolloutConfig reads as attributes and .get
    def get(self, key, default=None):
        return getattr(self, key, default)


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def adapter():
    """verl 0.9.1's trainer-side ``ServerAdapter`` of rollout rank 0 (``_has_server``); its server handle is looked
    up by verl itself (``_ensure_server_handle``: ``ray.get_actor("vllm_server_0_0")``)."""
    ad = vro.ServerAdapter.__new__(vro.ServerAdapter)
    ad.config = Config(free_cache_engine=False, checkpoint_engine=Config(update_weights_bucket_megabytes=64))
    ad.replica_rank = ad.rollout_rank = ad.node_rank = 0
    ad._has_server, ad._pd_role, ad.server_handle = True, None, None
    ad.zmq_handle, ad.use_shm = verl_ray.ZMQ, True
    return ad


def counts() -> dict:
    from shim.verify import weights

    return {k: v for k, v in weights.counts().items() if k in ("verified", "stale", "unverifiable")}


def run(phases, server, model) -> dict:
    from shim.verify import weights as verify

    ad = adapter()
    caught = Warnings()
    logging.getLogger("shim").addHandler(caught)
    out = {}
    for phase in phases:
        os.environ.update(phase.get("env", {}))
        with open(verl_ray.DROP, "w") as f:
            f.write(phase.get("drop") or "")
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
        weights = iter([(n, p.detach()) for n, p in model.named_parameters()])
        before, caught.messages, raised = counts(), [], None
        try:
            asyncio.run(ad.update_weights(weights, global_steps=len(out) + 1))
        except verify.StaleWeights:
            raised = "StaleWeights"
        want = {n: p.detach().clone() for n, p in model.named_parameters()}
        out[phase["name"]] = {"differs": ray.get(server.differs.remote(want), timeout=120),
                              "warnings": list(caught.messages), "raised": raised,
                              "counts": {k: v - before.get(k, 0) for k, v in counts().items()}}
        for k in phase.get("env", {}):
            os.environ.pop(k, None)
    return out


def main():
    phases = json.loads(sys.argv[1])
    verl_ray.install()
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's unix sockets live under it
    try:
        ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=100 * 1024 ** 2, _temp_dir=temp,
                 _node_ip_address="127.0.0.1", log_to_driver=True)
        # verl 0.9.1 vLLMReplica.__init__: self.server_class = ray.remote(vLLMHttpServer); launch_servers names it
        server = ray.remote(verl_ray.StandInServer).options(name="vllm_server_0_0", max_concurrency=16).remote()
        actor_pid = ray.get(server.start.remote(MODEL), timeout=180)
        result = {"decisions": ray.get(server.shim_decisions.remote(), timeout=60), "actor_pid": actor_pid,
                  "driver_pid": os.getpid()}
        result.update(run(phases, server, model))
        ray.get(server.stop.remote(), timeout=60)
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    print(json.dumps(result))


main()
