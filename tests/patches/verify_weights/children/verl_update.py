"""Child: verl's own weight update (``ServerAdapter.update_weights`` -> ``vLLMHttpServer.collective_rpc`` /
``clear_kv_cache``, verl's ``BucketedWeightSender``/``BucketedWeightReceiver`` over ZMQ and shared memory,
verl's ``vLLMColocateWorkerExtension.update_weights_from_ipc`` in the worker) on the stand-in's ``AsyncLLM``
(engine core in a forked process). ``sys.argv[1]``: JSON list of phases ``{"name", "shim": activate before it,
"engine_shim": activate it in the engine's process too (default), "drop": a tensor the engine's load leaves out, "only": stream only names containing this (a partial update), "extra": a bias name to stream as well (the
engine has none), "async": stream through an async iterator,
"env": variables set for it, "lora_base": a full update with ``peft_config`` (verl's base sync of a LoRA run,
names resolved to the engine's), "lora": an adapter update instead (``peft_config``, ``base_sync_done``; the engine
built with vLLM's LoRA when ``LORA=1``; ``drop`` then names the fault, ``_faulty_adapter``)}``; each is one
trainer step (every trainer weight, or every adapter tensor, + 0.01) and one ``update_weights``. Prints ``{phase: {"differs": the engine tensors that are not the trainer's (read in the
worker), "counts": the verdicts it added, "warnings": the shim's WARNINGs, "raised": an exception's type,
"status": why ``python -m shim status`` would say verify-weights-verl is not running}}``."""
import asyncio
import functools
import inspect
import json
import logging
import os
import sys
import threading
from types import SimpleNamespace

import torch
import verl.workers.rollout.vllm_rollout.vllm_async_server as vas
import verl.workers.rollout.vllm_rollout.vllm_rollout as vro
from transformers import AutoModelForCausalLM
from verl.workers.rollout.replica import RolloutMode
from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.worker import gpu_model_runner, gpu_worker

MODEL = os.environ["TEST_MODEL"]
DROP = os.environ["DROP_FILE"]    # a tensor name the engine's next load leaves out (the fault), or empty
ZMQ = f"ipc:///tmp/shim-verl-verify-{os.getpid()}.sock"
LORA = os.environ.get("LORA") == "1"  # the engine with vLLM's LoRA; phases with "lora" push an adapter
if LORA:  # what verl's worker extension does when vLLM builds its worker (before the engine core forks here)
    from verl.utils.vllm import VLLMHijack
    VLLMHijack.hijack()

def update_weights_from_ipc(self, peft_config=None, base_sync_done=False, use_shm=False):
    """Mirrors verl's ``vLLMColocateWorkerExtension.update_weights_from_ipc`` on its standard path (full weights,
    no FP8/QAT): verl's own ``BucketedWeightReceiver`` hands each bucket to ``model.load_weights``; and on its LoRA
    path (``peft_config`` with ``base_sync_done``, 0.9.1 ``utils.py``: ``remove_lora(VLLM_LORA_INT_ID)``, every
    bucket's tensors cloned and collected, then ``add_lora`` of verl's ``TensorLoRARequest``). vLLM mixes
    verl's class into its worker (``worker_extension_cls``); the stand-in has no such mixing, and verl's class
    reaches into real vLLM's LoRA and FP8 modules."""
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

    receiver = BucketedWeightReceiver(zmq_handle=ZMQ, device=torch.device("cpu"), use_shm=use_shm)
    if peft_config and base_sync_done:
        from verl.utils.vllm import TensorLoRARequest
        from verl.workers.rollout.vllm_rollout.utils import VLLM_LORA_INT_ID, VLLM_LORA_NAME, VLLM_LORA_PATH

        self.remove_lora(VLLM_LORA_INT_ID)
        got = {}
        receiver.receive_weights(on_bucket_received=lambda weights, *is_last: got.update(
            (name, tensor.clone()) for name, tensor in weights))
        self.add_lora(TensorLoRARequest(lora_name=VLLM_LORA_NAME, lora_int_id=VLLM_LORA_INT_ID,
                                        lora_path=VLLM_LORA_PATH, peft_config=peft_config,
                                        lora_tensors=_faulty_adapter(got)))
        return
    model = self.model_runner.model
    if peft_config:  # verl 0.9.1 _update_weights: names toggled to the engine's (.base_layer under vLLM's LoRA)
        from verl.utils.vllm.utils import resolve_weight_name

        names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        load = lambda weights, *is_last: model.load_weights(  # noqa: E731
            [(resolve_weight_name(model, n, names), t) for n, t in weights])
    else:
        load = lambda weights, *is_last: model.load_weights(weights)  # noqa: E731
    receiver.receive_weights(on_bucket_received=load)


def _faulty_adapter(tensors: dict) -> dict:
    """The adapter fault (``DROP``): ``wrong:<name>`` lands that tensor plus 1; any other text drops the tensors
    whose names contain it (a module's ``lora_A`` and ``lora_B``)."""
    with open(DROP) as f:
        fault = f.read().strip()
    if fault.startswith("wrong:"):
        name = fault[len("wrong:"):]
        return {n: t + 1 if n == name else t for n, t in tensors.items()}
    return {n: t for n, t in tensors.items() if not fault or fault not in n}


gpu_worker.Worker.update_weights_from_ipc = update_weights_from_ipc
for _name in ("ipc_collect", "empty_cache"):  # verl's sender ends with get_torch_device().<these>() (CUDA's)
    if not hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: None)
bucketed_weight_transfer.get_torch_device = lambda: torch.cpu  # 0.9.0 falls back to torch.cuda without a GPU


_load = gpu_model_runner.VllmModelMixin.load_weights


def _faulty_load(self, weights):
    """The fault: a push whose tensor ``DROP`` never lands (what verl#7904-like corruption looks like). Like vLLM's
    Llama/Qwen2 ``load_weights`` ("Skip loading extra bias for GPTQ models"), a bias the model lacks is skipped."""
    with open(DROP) as f:
        drop = f.read().strip()
    own = dict(self.named_parameters())
    return _load(self, [(n, t) for n, t in weights if n not in (drop, _base_layer(drop))
                        and not (n.endswith(".bias") and n not in own)])


def _base_layer(name: str) -> str:
    head, _, leaf = name.rpartition(".")
    return f"{head}.base_layer.{leaf}"


gpu_model_runner.VllmModelMixin.load_weights = _faulty_load


class ActorHandle:
    """Mirrors Ray's ``ActorHandle``: ``handle.method.remote(...)`` submits the call to the actor, which runs
    it on its own event loop (here a thread of this process), and returns an awaitable reference."""

    def __init__(self, actor, loop):
        self._actor, self._loop = actor, loop

    def __getattr__(self, name):
        method = getattr(self._actor, name)

        def remote(*args, **kwargs):
            return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop))

        return SimpleNamespace(remote=remote)


class Config(SimpleNamespace):  # verl's RolloutConfig reads as attributes and .get
    def get(self, key, default=None):
        return getattr(self, key, default)


LOOP = asyncio.new_event_loop()
threading.Thread(target=LOOP.run_forever, daemon=True).start()


def on_server(coro):
    return asyncio.run_coroutine_threadsafe(coro, LOOP).result(120)


async def _server():
    lora = dict(enable_lora=True, max_loras=1, max_lora_rank=8) if LORA else {}
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=MODEL, enable_sleep_mode=True,
                                                       gpu_memory_utilization=0.2, **lora))
    srv = vas.vLLMHttpServer.__new__(vas.vLLMHttpServer)
    srv.node_rank, srv.replica_rank, srv.rollout_mode, srv.engine = 0, 0, RolloutMode.HYBRID, engine
    srv.global_steps = None
    srv.config = Config(free_cache_engine=False)
    return srv


def adapter(srv):
    ad = vro.ServerAdapter.__new__(vro.ServerAdapter)
    ad.config = Config(free_cache_engine=False, checkpoint_engine=Config(update_weights_bucket_megabytes=64))
    ad.replica_rank = ad.rollout_rank = ad.node_rank = 0
    if "_has_server" in inspect.getsource(vro.ServerAdapter):  # 0.9.0 (set in __init__); before: rollout_rank 0
        ad._has_server, ad._pd_role = True, None
    ad.server_handle = ActorHandle(srv, LOOP)
    ad.zmq_handle, ad.use_shm = ZMQ, True
    return ad


def _activate(worker, env):
    """In the engine core's process (forked before the shim was on): what ``python -m shim``'s bootstrap does in
    every process verl starts (the engine's environment, then ``shim.activate()``)."""
    os.environ.update({k: v for k, v in env.items() if k.startswith("SHIM_")})
    import shim
    shim.activate()


def _differs(worker, want):
    got = dict(worker.model_runner.model.named_parameters())
    got.update({n.replace(".base_layer.", "."): p for n, p in got.items()})  # vLLM's LoRA layers: the base's name
    return sorted(n for n, t in want.items() if n in got and not torch.equal(got[n].detach(), t.to(got[n].dtype)))


def _adapter_differs(worker, want):
    """The modules whose delta (``scaling * B @ A``, ``want``) the engine's adapter 123 does not give within 2% of
    its largest element (a module the adapter lacks: where the delta is not zero). The stand-in stores ``lora_a``
    ``[in, r]`` and ``lora_b`` ``[r, out]`` with the scaling folded in."""
    adapter = worker.model_runner.lora_manager._adapter_manager.get_adapter(123)
    loras = adapter.loras if adapter is not None else {}
    off = []
    for module, delta in want.items():
        w = loras.get(module)
        got = (w.lora_a.double() @ w.lora_b.double()).T if w is not None else torch.zeros_like(delta)
        if float((got - delta).abs().max()) > 0.02 * float(delta.abs().max()):
            off.append(module)
    return sorted(off)


def adapter_deltas(adapter: dict, scaling: float) -> dict:
    out = {}
    for name, t in adapter.items():
        if ".lora_A." in name:
            module = name.removeprefix("base_model.model.").rsplit(".lora_A.", 1)[0]
            b = adapter[name.replace(".lora_A.", ".lora_B.")]
            out[module] = scaling * (b.double() @ t.double())
    return out


def make_adapter(model) -> dict:
    """A rank-4 adapter on every layer's ``q_proj`` and ``v_proj``, as verl's FSDP actor streams it
    (``get_peft_model_state_dict`` names), ``lora_B`` non-zero."""
    g = torch.Generator().manual_seed(5)
    out = {}
    for name, m in model.named_modules():
        if name.endswith(("q_proj", "v_proj")):
            out[f"base_model.model.{name}.lora_A.weight"] = torch.randn(4, m.in_features, generator=g) * 0.1
            out[f"base_model.model.{name}.lora_B.weight"] = torch.randn(m.out_features, 4, generator=g) * 0.1
    return out


PEFT_CONFIG = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "bias": "none"}


def engine_differs(srv, model) -> list:
    """Names whose engine tensor is not the trainer's (the truth the shim must tell), read in the worker."""
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    return on_server(srv.engine.collective_rpc(functools.partial(_differs, want=want)))[0]


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


async def _async(items):
    """An async iterator of ``(name, tensor)``, as a checkpoint engine's ``receive_weights`` gives verl."""
    for item in items:
        yield item


def weights_module():
    from shim.verify import weights
    return weights


def counts() -> dict:
    try:
        from shim.verify import weights
    except ImportError:
        return {}
    return {k: v for k, v in weights.counts().items() if k in ("verified", "stale", "unverifiable")}


def main():
    phases = json.loads(sys.argv[1])
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    srv = on_server(_server())
    ad = adapter(srv)
    caught = Warnings()
    logging.getLogger("shim").addHandler(caught)
    out = {}
    lora_tensors = make_adapter(model) if LORA else {}
    for phase in phases:
        os.environ.update(phase.get("env", {}))
        if phase.get("shim"):
            import shim
            shim.activate()
            if phase.get("engine_shim", True):
                on_server(srv.engine.collective_rpc(functools.partial(_activate, env=dict(os.environ))))
        with open(DROP, "w") as f:
            f.write(phase.get("drop") or "")
        kwargs = {"peft_config": PEFT_CONFIG, "base_sync_done": False} if phase.get("lora_base") else {}
        if phase.get("lora"):  # an adapter update: the adapter changes, the base does not
            lora_tensors = {n: t + 0.01 for n, t in lora_tensors.items()}
            weights = list(lora_tensors.items())
            kwargs = {"peft_config": PEFT_CONFIG, "base_sync_done": True}
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
            only = phase.get("only") or ""
            weights = [(n, p.detach()) for n, p in model.named_parameters() if only in n]
        if phase.get("extra"):  # a tensor the engine has no parameter for (its loader skips it)
            weights.append((phase["extra"], torch.ones(model.config.hidden_size)))
        weights = _async(weights) if phase.get("async") else iter(weights)
        before, caught.messages, raised = counts(), [], None
        try:
            asyncio.run(ad.update_weights(weights, global_steps=len(out) + 1, **kwargs))
        except Exception as exc:
            raised = type(exc).__name__
            if not isinstance(exc, weights_module().StaleWeights):
                import traceback
                traceback.print_exc()
        after = counts()
        differs = (on_server(srv.engine.collective_rpc(functools.partial(
            _adapter_differs, want=adapter_deltas(lora_tensors, 2.0))))[0] if phase.get("lora")
            else engine_differs(srv, model))
        out[phase["name"]] = {"differs": differs, "warnings": list(caught.messages),
                              "counts": {k: v - before.get(k, 0) for k, v in after.items()}, "raised": raised,
                              "status": weights_module().not_running_reason("verify-weights-verl")}
        for k in phase.get("env", {}):
            os.environ.pop(k, None)
    on_server(_shutdown(srv))
    print(json.dumps(out))


async def _shutdown(srv):
    srv.engine.shutdown()


main()
