"""verl's ``vLLMHttpServer`` as a REAL Ray actor on the vLLM stand-in (``tests/patches/verify_weights/test_verl_ray.py``).

Imported by reference in the Ray actor (``ray.remote`` ships :class:`StandInServer` by name, so the actor imports
this module; the repository is on the ``PYTHONPATH`` every Ray worker inherits) and in the stand-in's engine-core
process (forked from the actor). What differs from verl's own server is only how the engine comes to be:
``vLLMHttpServer.__init__`` / ``launch_server`` build a real vLLM ``AsyncLLM`` behind an HTTP server, here
:meth:`StandInServer.start` builds the stand-in's ``AsyncLLM`` (engine core in a forked process). Every method the
trainer calls (``collective_rpc``, ``clear_kv_cache``, ``set_global_steps``) is verl's, inherited, and reaches the
actor the way verl's own actor gets it: ``ray.remote(cls)`` (verl 0.9.1 ``vLLMReplica.__init__``) -> Ray's
``_modify_class`` and ``_inject_tracing_into_class`` -> the class pickled with Ray's cloudpickle -> loaded in the
actor's worker process.

:func:`install` is the stand-in's glue of ``children/verl_update.py`` (verl's worker extension on the stand-in's
``Worker``; the fault: a tensor the engine's load leaves out, named in a file).
"""
from __future__ import annotations

import functools
import os

import verl.workers.rollout.vllm_rollout.vllm_async_server as vas

ZMQ = os.environ.get("TEST_VERL_ZMQ", "")     # verl's weight-transfer socket, shared by trainer and worker
DROP = os.environ.get("TEST_VERL_DROP", "")   # file naming the tensor the engine's next load leaves out (the fault)


def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
    """verl's ``vLLMColocateWorkerExtension.update_weights_from_ipc`` on its standard path (as in
    ``children/verl_update.py``): verl's own ``BucketedWeightReceiver`` hands each bucket to ``model.load_weights``."""
    import torch
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

    receiver = BucketedWeightReceiver(zmq_handle=ZMQ, device=torch.device("cpu"), use_shm=use_shm)
    receiver.receive_weights(on_bucket_received=lambda weights, *is_last: self.model_runner.model.load_weights(weights))


def _faulty_load(self, weights):
    """The fault: a push whose tensor named in :data:`DROP` never lands; a bias the model lacks is skipped (vLLM's
    Qwen2 ``load_weights``)."""
    with open(DROP) as f:
        drop = f.read().strip()
    own = dict(self.named_parameters())
    return _LOAD(self, [(n, t) for n, t in weights if n != drop and not (n.endswith(".bias") and n not in own)])


_LOAD = None


def install() -> None:
    """The stand-in's glue, in the process that runs it (driver: the sender's device calls; actor: everything,
    inherited by the forked engine core). Idempotent."""
    global _LOAD
    import torch
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer
    from vllm.v1.worker import gpu_model_runner, gpu_worker

    for name in ("ipc_collect", "empty_cache"):  # verl's sender ends with get_torch_device().<these>() (CUDA's)
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: None)
    bucketed_weight_transfer.get_torch_device = lambda: torch.cpu  # falls back to torch.cuda without a GPU
    gpu_worker.Worker.update_weights_from_ipc = update_weights_from_ipc
    if _LOAD is None:
        _LOAD = gpu_model_runner.VllmModelMixin.load_weights
        gpu_model_runner.VllmModelMixin.load_weights = _faulty_load


def _differs(worker, want) -> list:
    import torch

    got = dict(worker.model_runner.model.named_parameters())
    return sorted(n for n, t in want.items() if n in got and not torch.equal(got[n].detach(), t.to(got[n].dtype)))


def _decisions(worker) -> dict:
    from shim.engine import registry

    return {k: v.text() for k, v in registry.decisions().items() if k.startswith("verify-weights")}


class StandInServer(vas.vLLMHttpServer):
    """verl's ``vLLMHttpServer`` with the stand-in's engine; the methods under test are verl's (inherited)."""

    def __init__(self):  # verl's __init__ reads a full RolloutConfig and launches vLLM's HTTP server
        self.engine = None

    async def start(self, model: str) -> int:
        """The stand-in's ``AsyncLLM`` and what verl's HYBRID server reads in ``collective_rpc`` /
        ``clear_kv_cache`` (node 0, HYBRID, no PD split). Returns the actor's pid."""
        from types import SimpleNamespace

        from verl.workers.rollout.replica import RolloutMode
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        install()

        class Config(SimpleNamespace):  # verl's RolloutConfig reads as attributes and .get
            def get(self, key, default=None):
                return getattr(self, key, default)

        self.node_rank, self.replica_rank, self.rollout_mode = 0, 0, RolloutMode.HYBRID
        self.global_steps, self._disaggregation_role, self._pd_decode_peers = None, "null", []
        self.config = Config(free_cache_engine=False)
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, enable_sleep_mode=True,
                                                                gpu_memory_utilization=0.2))
        return os.getpid()

    async def shim_decisions(self) -> dict:
        """The shim's verify-weights decisions here (the actor) and in the engine's worker."""
        return {"actor": _decisions(None), "worker": (await self.engine.collective_rpc(_decisions))[0]}

    async def differs(self, want: dict) -> list:
        """Engine tensors that are not ``want`` (the trainer's), read in the worker: the truth."""
        return (await self.engine.collective_rpc(functools.partial(_differs, want=want)))[0]

    async def stop(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
