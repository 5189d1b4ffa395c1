"""What a push to vLLM's own LoRA gives the engine from a PEFT model: the base unmerged under its ``.base_layer``
names, and the adapter in vLLM's LoRA manager (weight verification's source, ``shim.verify.weights.armed``).

ms-swift 3.10-4.6 with ``--vllm_enable_lora``: the first push is the base (``_move_full_model_to_vllm``, no merge:
``base_model.model.`` dropped, ``.base_layer`` kept, the adapter tensors and ``modules_to_save``' originals
left out), every later one the adapter (``_move_adapter_to_vllm``: ``get_peft_model_state_dict`` of the active
adapter into ``add_lora``). :func:`verified_tensors` gives both: the base tensors by pushed name and, as
``.adapter()``, the trainer's adapter as the push reads it now (``shim.verify.lora.compare``). vLLM wraps every
linear layer it supports in a LoRA layer, targeted or not: a tensor without an adapter is also found under its
``.base_layer`` name.
"""
from __future__ import annotations

import sys

from shim.peft.merge import PEFT_PREFIX, pushed_name


class Adapted(dict):
    """The base tensors by pushed name; :meth:`adapter`: ``{vLLM module name: (lora_A weight, lora_B weight,
    scaling)}`` of the active adapter, read at the call."""

    def __init__(self, layers: list, adapter_name: str):
        super().__init__()
        self._layers, self._name = layers, adapter_name

    def adapter(self) -> dict:
        out = {}
        for module, layer in self._layers:
            if self._name in getattr(layer, "lora_A", {}):
                out[module] = (layer.lora_A[self._name].weight, layer.lora_B[self._name].weight,
                               layer.scaling[self._name])
            elif self._name in getattr(layer, "lora_embedding_A", {}):
                out[module] = (layer.lora_embedding_A[self._name], layer.lora_embedding_B[self._name],
                               layer.scaling[self._name])
        return out


def verified_tensors(model) -> "tuple[Adapted | None, str | None]":
    """``(tensors, None)`` for a PEFT model pushed to vLLM's LoRA; ``(None, why)`` where the adapter vLLM holds
    cannot be reproduced (a LoRA variant or bias, another tuner, sharded parameters); ``(None, None)``: not a PEFT
    model."""
    if "peft" not in sys.modules:
        return None, None
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not isinstance(model, PeftModel):
        return None, None
    active = model.active_adapters if isinstance(getattr(model, "active_adapters", None), list) else ["default"]
    if len(active) != 1:
        return None, f"PEFT model with {len(active)} active adapters (vLLM's LoRA gets one)"
    name = active[0]
    layers = []
    for module, layer in model.named_modules():
        if not isinstance(layer, BaseTunerLayer):
            continue
        if not isinstance(layer, LoraLayer):
            return None, f"PEFT model with {type(layer).__name__} layers (not LoRA)"
        if getattr(layer, "lora_variant", None) and layer.lora_variant.get(name) is not None:
            return None, f"PEFT model with a LoRA variant ({type(layer.lora_variant[name]).__name__})"
        if getattr(layer, "lora_bias", {}).get(name):
            return None, "PEFT model with a LoRA bias (lora_bias=True)"
        layers.append((module.removeprefix(PEFT_PREFIX), layer))
    from shim.verify import layout

    out = Adapted(layers, name)
    prefix = getattr(model, "prefix", None) or "lora_"
    for pname, p in model.named_parameters():
        if hasattr(p, "ds_id") or callable(getattr(p, "full_tensor", None)):
            return None, "PEFT model sharded by ZeRO-3 or FSDP (the adapter needs whole tensors)"
        pushed = pushed_name(pname, prefix, base_layer=True)
        if pushed is not None:
            out.setdefault(layout.trainer_name(pushed), p)
    tied = "model.embed_tokens.weight"
    if "lm_head.weight" not in out and tied in out:  # tied embeddings (as layout.trainer_params)
        out["lm_head.weight"] = out[tied]
    for pushed, p in list(out.items()):  # vLLM wraps every supported linear layer, adapter or not: .base_layer
        head, _, leaf = pushed.rpartition(".")
        if ".base_layer" not in pushed:
            out.setdefault(f"{head}.base_layer.{leaf}", p)
    return out, None
