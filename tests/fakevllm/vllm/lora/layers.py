"""Mirrors vllm/lora/layers (0.10.2): ``LoRAMapping`` (layers/utils.py) and
``BaseLinearLayerWithLoRA`` (layers/base_linear.py) for a replicated linear layer.

A LoRA layer replaces the model's linear module and keeps it as ``base_layer`` (so the
model's parameter names become ``<module>.base_layer.weight``, the names ms-swift's full
push keeps with ``vllm_enable_lora``). ``create_lora_weights`` allocates the GPU slots
``lora_a_stacked`` ``[max_loras, 1, max_lora_rank, in]`` and ``lora_b_stacked``
``[max_loras, 1, out, max_lora_rank]``: plain tensors, neither parameters nor buffers,
allocated while the model loads (inside the "weights" memory pool tag), so a level-1
sleep offloads them with the weights and a level-2 sleep discards them (they are not
among the ``named_buffers`` a level-2 sleep saves). ``set_lora`` copies one adapter into
a slot, ``reset_lora`` zeroes it. The forward adds ``x @ A^T @ B^T`` of the slot the
current request maps to (punica's ``add_lora_linear``; the stand-in runs one request at
a time, so the mapping is one slot index shared by every layer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn


@dataclass
class LoRAMapping:
    index_mapping: tuple
    prompt_mapping: tuple
    is_prefill: bool = False


class PunicaWrapper:
    """The slot each token uses (one request at a time here: one index, -1 = no LoRA)."""

    def __init__(self):
        self.index = -1


class LinearWithLoRA(nn.Module):
    def __init__(self, base_layer: nn.Linear):
        super().__init__()
        self.base_layer = base_layer
        self.input_size = base_layer.in_features
        self.output_size = base_layer.out_features
        self.device = base_layer.weight.device
        self.n_slices = 1
        self.tp_size = 1
        self.lora_bias_stacked = None
        self.punica_wrapper: Optional[PunicaWrapper] = None

    @classmethod
    def can_replace_layer(cls, source_layer, lora_config, packed_modules_list, model_config=None) -> bool:
        return type(source_layer) is nn.Linear and len(packed_modules_list) <= 1

    def create_lora_weights(self, max_loras: int, lora_config, model_config=None) -> None:
        self.lora_config = lora_config
        dtype = lora_config.lora_dtype
        self.lora_a_stacked = tuple(torch.zeros(max_loras, 1, lora_config.max_lora_rank, self.input_size,
                                                dtype=dtype, device=self.device) for _ in range(self.n_slices))
        self.lora_b_stacked = tuple(torch.zeros(max_loras, 1, self.output_size, lora_config.max_lora_rank,
                                                dtype=dtype, device=self.device) for _ in range(self.n_slices))
        self.output_slices = (self.output_size,)

    def named_lora_slots(self, prefix: str):
        """The slot tensors as (name, tensor), for the stand-in's "weights" allocation."""
        for i, t in enumerate(self.lora_a_stacked):
            yield f"{prefix}.lora_a_stacked.{i}", t
        for i, t in enumerate(self.lora_b_stacked):
            yield f"{prefix}.lora_b_stacked.{i}", t

    def set_mapping(self, punica_wrapper: PunicaWrapper) -> None:
        self.punica_wrapper = punica_wrapper

    def reset_lora(self, index: int) -> None:
        for s in range(self.n_slices):
            self.lora_a_stacked[s][index] = 0
            self.lora_b_stacked[s][index] = 0

    def set_lora(self, index: int, lora_a: torch.Tensor, lora_b: torch.Tensor,
                 embeddings_tensor: Optional[torch.Tensor], lora_bias: Optional[torch.Tensor] = None) -> None:
        assert len(self.lora_a_stacked) == len(self.lora_b_stacked) == self.n_slices == 1
        self.reset_lora(index)
        with torch.no_grad():
            self.lora_a_stacked[0][index, 0, :lora_a.shape[1], :lora_a.shape[0]].copy_(lora_a.T)
            self.lora_b_stacked[0][index, 0, :lora_b.shape[1], :lora_b.shape[0]].copy_(lora_b.T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self.base_layer(x)
        index = self.punica_wrapper.index if self.punica_wrapper is not None else -1
        if index >= 0:
            a = self.lora_a_stacked[0][index, 0].to(x.dtype)  # [r, in]
            b = self.lora_b_stacked[0][index, 0].to(x.dtype)  # [out, r]
            output = output + (x @ a.T) @ b.T
        return output

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight
