"""Mirrors vllm/lora/utils.py (0.10.2): ``parse_fine_tuned_lora_name``,
``get_supported_lora_modules``, ``get_adapter_absolute_path``, ``replace_submodule``
and ``from_layer``.

The stand-in's model is the transformers model with its own module names (no fused
``qkv_proj`` / ``gate_up_proj``, so no packed modules). In vLLM every ``LinearBase``
supports LoRA and the output head is a ``ParallelLMHead`` (an embedding, not a linear
layer, and Qwen2 declares no ``embedding_modules``): here every ``nn.Linear`` but the
model's output embeddings.
"""
from __future__ import annotations

import os
from typing import Optional

from torch import nn


def parse_fine_tuned_lora_name(name: str, weights_mapper=None) -> tuple:
    if name.startswith("base_model.model."):
        name = name.replace("base_model.model.", "")
        name = weights_mapper._map_name(name) if weights_mapper else name
        name = "base_model.model." + name
    else:
        name = weights_mapper._map_name(name) if weights_mapper else name
    start_index = 2 if name.startswith("base_model.model.") else 0
    parts = name.split(".")
    if parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"):
        return ".".join(parts[start_index:-2]), parts[-2] == "lora_A", False
    if parts[-1] in ("lora_embedding_A", "lora_embedding_B"):
        return ".".join(parts[start_index:-1]), parts[-1] == "lora_embedding_A", False
    if parts[-1] == "bias":
        return ".".join(parts[start_index:-2]), False, True
    raise ValueError(f"{name} is unsupported LoRA weight")


def get_supported_lora_modules(model: nn.Module) -> list:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted({name.split(".")[-1] for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and m is not head})


def get_adapter_absolute_path(lora_path: str) -> str:
    """Local paths only (vLLM falls back to a Hugging Face snapshot download)."""
    if os.path.isabs(lora_path):
        return lora_path
    if lora_path.startswith("~"):
        return os.path.expanduser(lora_path)
    if os.path.exists(lora_path):
        return os.path.abspath(lora_path)
    return lora_path  # vLLM: a Hugging Face snapshot download, which fails here -> the path as given


def replace_submodule(model: nn.Module, module_name: str, new_module: nn.Module) -> nn.Module:
    parent = model.get_submodule(".".join(module_name.split(".")[:-1]))
    setattr(parent, module_name.split(".")[-1], new_module)
    return new_module


def from_layer(layer: nn.Module, max_loras: int, lora_config, packed_modules_list: list,
               model_config: Optional[object] = None) -> nn.Module:
    from vllm.lora.layers import LinearWithLoRA

    if LinearWithLoRA.can_replace_layer(layer, lora_config, packed_modules_list, model_config):
        instance = LinearWithLoRA(layer)
        instance.create_lora_weights(max_loras, lora_config, model_config)
        return instance
    return layer
