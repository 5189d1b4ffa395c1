"""Mirrors vllm/lora/lora.py ``LoRALayerWeights`` (0.10.2): one layer's ``lora_a``
(stored ``[in, r]``, the PEFT ``lora_A.weight`` transposed) and ``lora_b`` (``[r, out]``);
``optimize()`` folds the scaling into ``lora_b``.
"""
from __future__ import annotations

from typing import Optional

import torch


class LoRALayerWeights:
    def __init__(self, module_name: str, rank: int, lora_alpha: int, lora_a: Optional[torch.Tensor],
                 lora_b: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None,
                 embeddings_tensor: Optional[torch.Tensor] = None, scaling: Optional[float] = None) -> None:
        self.module_name = module_name
        self.rank = rank
        self.lora_alpha = lora_alpha
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.bias = bias
        self.embeddings_tensor = embeddings_tensor
        self.scaling = self.lora_alpha / self.rank if scaling is None else scaling

    def optimize(self) -> "LoRALayerWeights":
        """Optimize the LoRA by merging the scaling into lora_b."""
        if self.scaling == 1:
            return self
        self.lora_b *= self.scaling
        self.scaling = 1
        return self

    @property
    def input_dim(self) -> int:
        return self.lora_a.shape[0]

    @property
    def output_dim(self) -> int:
        return self.lora_b.shape[1]

    @property
    def is_packed(self) -> bool:
        return False

    @property
    def extra_vocab_size(self) -> int:
        return self.embeddings_tensor.shape[0] if self.embeddings_tensor is not None else 0

    @classmethod
    def from_config(cls, module_name: str, peft_helper, embeddings_tensor=None) -> "LoRALayerWeights":
        return cls(module_name, peft_helper.r, peft_helper.lora_alpha, None, None, None, embeddings_tensor,
                   peft_helper.vllm_lora_scaling_factor)
