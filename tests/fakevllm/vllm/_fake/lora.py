"""Test-side view of LoRA in the stand-in (not vLLM): the weights the forward pass of the
current request computes with."""
from __future__ import annotations


def effective_weights(model) -> dict:
    """name -> tensor over the engine model's parameters, each LoRA layer's
    ``base_layer.weight`` replaced by ``<module>.weight`` = base + B @ A of the slot the current
    request maps to (base alone when it maps to none). Compare with a PEFT trainer model's
    merged weights (base + ``get_delta_weight``)."""
    import torch

    from vllm.lora.layers import LinearWithLoRA

    out = {}
    lora_prefixes = set()
    for name, m in model.named_modules():
        if isinstance(m, LinearWithLoRA):
            lora_prefixes.add(name)
            w = m.base_layer.weight.detach().to(torch.float64)
            idx = m.punica_wrapper.index if m.punica_wrapper is not None else -1
            if idx >= 0:
                a = m.lora_a_stacked[0][idx, 0].to(torch.float64)
                b = m.lora_b_stacked[0][idx, 0].to(torch.float64)
                w = w + b @ a
            out[f"{name}.weight"] = w
            if m.base_layer.bias is not None:
                out[f"{name}.bias"] = m.base_layer.bias.detach().to(torch.float64)
    for name, p in model.named_parameters():
        if any(name.startswith(f"{prefix}.base_layer.") for prefix in lora_prefixes):
            continue
        out[name] = p.detach().to(torch.float64)
    return out
