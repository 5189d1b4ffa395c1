"""Test-side reference for a PEFT LoRA model's merged weights (computed out of place, in float32).

``reference(model)`` is what a weight push of the PEFT model ``model`` should put in the engine,
under the engine's names: every base tensor, and for each LoRA layer (``lora.Linear``,
``lora.Embedding``) its base weight plus ``B @ A * scaling`` of every active adapter (and, with
``lora_bias=True``, its base bias plus ``lora_B.bias * scaling``), summed in float32 from the tensors as
they are now. It reads the adapter tensors directly (not PEFT's
``merge``/``get_delta_weight``), so it does not share a line with what it checks.

``beyond_one_rounding(pushed, ref, dtype)`` counts the pushed elements further from the reference
than one rounding to ``dtype`` at the operands' magnitude; ``adapter_effect`` the elements where the
adapter moves a base weight by more than that (a check that is not vacuous needs many of those).

``base_snapshot``/``changed_elements``: the frozen base tensors' bytes before and after.
"""
from __future__ import annotations

PEFT_PREFIX = "base_model.model."


def vllm_name(peft_name: str) -> str:
    """The name TRL pushes a PEFT model's base tensor under (``_iter_named_params``)."""
    return peft_name.removeprefix(PEFT_PREFIX).replace(".base_layer", "").replace("modules_to_save.default.", "")


def _delta(layer, adapter):
    """float32 ``B @ A * scaling`` of one adapter, shaped like the base weight; None where absent."""
    from peft.tuners import lora

    if getattr(layer, "lora_variant", None) or getattr(layer, "use_dora", {}).get(adapter):
        raise TypeError(f"no test reference for LoRA variants ({type(layer).__name__})")
    if type(layer) is lora.Linear and adapter in layer.lora_A:
        delta = layer.lora_B[adapter].weight.float() @ layer.lora_A[adapter].weight.float()
        return (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[adapter]
    if type(layer) is lora.Embedding and adapter in layer.lora_embedding_A:
        delta = layer.lora_embedding_B[adapter].float() @ layer.lora_embedding_A[adapter].float()
        return delta.T * layer.scaling[adapter]
    if adapter in getattr(layer, "lora_A", {}) or adapter in getattr(layer, "lora_embedding_A", {}):
        raise TypeError(f"no test reference for {type(layer).__name__}")
    return None


def _bias_delta(layer):
    """float32 ``lora_B.bias * scaling`` summed over the active adapters with ``lora_bias`` (PEFT's merge adds
    it to the base bias); None where no active adapter of ``layer`` has one."""
    total = None
    for adapter in layer.active_adapters:
        if getattr(layer, "lora_bias", {}).get(adapter) and adapter in getattr(layer, "lora_B", {}):
            delta = layer.lora_B[adapter].bias.float() * layer.scaling[adapter]
            total = delta if total is None else total + delta
    return total


def bias_effect(model, dtype) -> int:
    """Elements of the LoRA layers' base biases that a LoRA bias (``lora_bias=True``) moves by more than one
    rounding to ``dtype`` (0 without a LoRA bias)."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    count = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, BaseTunerLayer) or module.merged:
                continue
            delta = _bias_delta(module)
            if delta is not None:
                base = module.get_base_layer().bias.detach().float()
                count += int((delta.abs() > _one_rounding(base.abs() + delta.abs(), dtype)).sum())
    return count


def reference(model) -> dict:
    """vLLM name -> (float32 merged tensor, float32 sum of |delta|) for every base tensor of ``model``."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    deltas = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, BaseTunerLayer) or module.merged:
            continue
        total = None
        for adapter in module.active_adapters:
            delta = _delta(module, adapter)
            if delta is not None:
                total = delta if total is None else total + delta
        if total is not None:
            deltas[f"{module_name}.base_layer.weight"] = total
        bias = _bias_delta(module)
        if bias is not None:
            deltas[f"{module_name}.base_layer.bias"] = bias
    out = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if model.prefix in name or "original_module" in name:
                continue
            base = param.detach().float()
            delta = deltas.get(name)
            out[vllm_name(name)] = (base if delta is None else base + delta,
                                    base.abs() if delta is None else base.abs() + delta.abs())
    return out


def _one_rounding(magnitude, dtype):
    """One unit in the last place of ``dtype`` at ``magnitude`` (elementwise)."""
    import torch

    _, exponent = torch.frexp(magnitude.clamp_min(torch.finfo(dtype).tiny))
    return torch.ldexp(torch.full_like(magnitude, torch.finfo(dtype).eps), exponent - 1)


def beyond_one_rounding(pushed: dict, ref: dict, dtype) -> int:
    """Elements of ``pushed`` (name -> tensor) further than one ``dtype`` rounding from ``ref`` (every
    tensor in ``ref``; a name missing from ``pushed``, or of another shape, counts all its elements)."""
    import torch

    count = 0
    with torch.no_grad():
        for name, (merged, magnitude) in ref.items():
            got = pushed.get(name)
            if got is None or got.shape != merged.shape:
                count += merged.numel()
                continue
            count += int(((got.detach().float() - merged).abs() > _one_rounding(magnitude, dtype)).sum())
    return count


def adapter_effect(model, dtype) -> dict:
    """LoRA layer class name -> elements of its base weights that the adapter moves by more than one
    rounding (summed over the model's layers of that class)."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    count: dict = {}
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, BaseTunerLayer):
                continue
            base = module.get_base_layer().weight.detach().float()
            for adapter in module.active_adapters:
                delta = _delta(module, adapter)
                if delta is not None:
                    moved = int((delta.abs() > _one_rounding(base.abs() + delta.abs(), dtype)).sum())
                    count[type(module).__name__] = count.get(type(module).__name__, 0) + moved
    return count


def base_snapshot(model) -> dict:
    """Copies of the frozen base tensors (everything that is not an adapter tensor)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if model.prefix not in name}


_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def _bits(tensor):
    import torch

    return tensor.detach().reshape(-1).view(getattr(torch, _INT[tensor.element_size()]))


def changed_elements(model, snapshot: dict) -> int:
    """Elements of the base tensors whose bytes differ from ``snapshot``."""
    params = dict(model.named_parameters())
    return sum(int((_bits(params[name]) != _bits(before)).sum()) for name, before in snapshot.items())
