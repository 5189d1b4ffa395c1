"""Weight verification of verl's LoRA adapter updates (``update_weights(..., peft_config=..., base_sync_done=True)``).

verl 0.7.1-0.9.1 (``vLLMColocateWorkerExtension.update_weights_from_ipc`` / ``_update_weights``, read in the
wheels): with ``peft_config`` and ``base_sync_done`` the worker removes the adapter ``VLLM_LORA_INT_ID`` (123),
collects the streamed PEFT tensors (``base_model.model.<module>.lora_A.weight`` ...) and hands them to
``add_lora`` as a ``TensorLoRARequest`` (verl's ``VLLMHijack`` makes ``_load_adapter`` build the ``LoRAModel``
from them): they land in vLLM's LoRA manager, not the model's weights. The trainer half keeps a CPU copy of what
streams (adapters are small), then asks the workers for the digests of adapter 123 (its tensors and the device
slots it occupies, ``shim.verify.lora``) and compares them with the streamed tensors as vLLM stores them (the
scaling ``lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA, from ``peft_config``).
"""
from __future__ import annotations

import math
import sys
import time

from shim.engine import log
from shim.verl.verify_rpc import Watch

LORA_ID = 123
"""verl's ``VLLM_LORA_INT_ID`` (``verl/workers/rollout/vllm_rollout/utils.py``, 123 in 0.7.1-0.9.1)."""
UTILS = "verl.workers.rollout.vllm_rollout.utils"
PREFIX = "base_model.model."


def lora_id() -> int:
    return int(getattr(sys.modules.get(UTILS), "VLLM_LORA_INT_ID", LORA_ID))


def scaling(peft_config) -> float:
    """vLLM's ``PEFTHelper.vllm_lora_scaling_factor`` of ``peft_config`` (a dict, or an object)."""
    get = peft_config.get if isinstance(peft_config, dict) else lambda k, d=None: getattr(peft_config, k, d)
    r, alpha = get("r"), get("lora_alpha")
    return alpha / math.sqrt(r) if get("use_rslora", False) else alpha / r


def module_of(name: str) -> "tuple[str, str] | None":
    """``(vLLM module name, "A" or "B")`` of a streamed PEFT adapter tensor name, or None (not ``lora_A``/``B``)."""
    parts = name.removeprefix(PREFIX).split(".")
    if len(parts) > 2 and parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[:-2]), parts[-2][-1]
    if len(parts) > 1 and parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[:-1]), parts[-1][-1]
    return None


class AdapterUpdate(Watch):
    """One adapter update: a CPU copy of each streamed tensor (:meth:`Watch.watch`), then the check."""

    def __init__(self, peft_config):
        self.tensors: dict = {}
        self.failed = ""
        self.seconds = 0.0
        try:
            self.scaling = scaling(peft_config)
        except Exception as exc:  # a peft_config without r / lora_alpha
            self.failed = f"the adapter's scaling cannot be read from peft_config ({type(exc).__name__}: {exc})"

    def take(self, name: str, tensor) -> None:
        if module_of(name) is None:
            self.failed = f"the adapter update streamed {name}, which vLLM's LoRA takes for no lora_A/lora_B"
        else:
            self.tensors[name] = tensor.detach().to("cpu", copy=True)

    def pushed(self) -> dict:
        """``{module: (lora_A, lora_B, scaling)}`` (``shim.verify.lora.compare``); a module streamed with one of
        its two tensors: that tensor against an empty other (vLLM cannot build it: reported)."""
        import torch

        parts: dict = {}
        for name, t in self.tensors.items():
            module, kind = module_of(name)
            parts.setdefault(module, {})[kind] = t
        empty = torch.zeros(0)
        return {m: (p.get("A", empty), p.get("B", empty), self.scaling) for m, p in parts.items()}


async def check(adapter, engine, update: AdapterUpdate, step) -> None:
    """After verl's adapter update: the workers' adapter :func:`lora_id` against what streamed."""
    from shim.verify import lora, weights
    from shim.verl import verify_rpc as v

    if update.failed:
        v.unverifiable(engine, update.failed, disable=False)
        return
    if not update.tensors:
        v.unverifiable(engine, "the adapter update streamed no tensor through the shim's watch", disable=False)
        return
    t0 = time.perf_counter()
    results = await v.ask(adapter, {"lora": {"id": lora_id()}})
    if not results:
        v.unverifiable(engine, v.NO_SERVER_HALF)
        return
    differ = lora.compare(results, update.pushed())
    seconds = update.seconds + time.perf_counter() - t0
    engine.updates += 1
    if not differ:
        weights.record("verified", seconds)
        if log.debugging():
            log.debug(f"verify-weights ({v.SITE}): vLLM's LoRA manager holds the {len(update.tensors)} adapter "
                      f"tensors the update streamed at step {'?' if step is None else step} ({seconds * 1e3:.2f} ms)")
        return
    engine.stale += 1
    weights.record("stale", seconds)
    weights.report_stale(f"verl rollout replica {getattr(adapter, 'replica_rank', '?')}", v.SITE, differ, "exact",
                         step, None, engine.stale, engine.updates,
                         "after the adapter update vLLM's LoRA manager holds another adapter than the trainer "
                         "streamed", "updates")
