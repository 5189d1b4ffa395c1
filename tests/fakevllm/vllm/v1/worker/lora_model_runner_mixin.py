"""Mirrors vllm/v1/worker/lora_model_runner_mixin.py ``LoRAModelRunnerMixin`` (0.10.2), a base
of ``GPUModelRunner``: ``load_lora_model`` (called from ``load_model`` when LoRA is enabled,
inside the "weights" memory pool: the model's linear layers become LoRA layers with their
GPU slots), ``_set_active_loras`` (before each forward pass: the requested adapters are
added -- loaded if not registered -- and the token-to-slot mapping set), ``add_lora`` /
``remove_lora`` / ``list_loras`` (what ``LLMEngine.add_lora`` reaches through the executor's
``collective_rpc``). No warm-up dummy LoRAs (vLLM adds and removes them while profiling).
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from vllm.lora.layers import LoRAMapping
from vllm.lora.request import LoRARequest
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager


class LoRAModelRunnerMixin:
    LORA_WARMUP_RANK = 8
    lora_manager: Optional[LRUCacheWorkerLoRAManager] = None

    def load_lora_model(self, model: nn.Module, model_config, scheduler_config, lora_config, device) -> nn.Module:
        # LoRAConfig.verify_with_model_config: "auto" is the model's dtype (the stand-in runs float32)
        if lora_config.lora_dtype in (None, "auto"):
            lora_config.lora_dtype = next(model.parameters()).dtype
        text_config = model_config.hf_config
        max_num_seqs = getattr(scheduler_config, "max_num_seqs", 256)
        self.lora_manager = LRUCacheWorkerLoRAManager(
            max_num_seqs, getattr(scheduler_config, "max_num_batched_tokens", 8192),
            getattr(text_config, "vocab_size", model.config.vocab_size), lora_config, device,
            getattr(model, "embedding_modules", {}), getattr(model, "embedding_padding_modules", []),
            max_position_embeddings=getattr(text_config, "max_position_embeddings", None))
        return self.lora_manager.create_lora_manager(model)

    def _set_active_loras(self, prompt_lora_mapping: tuple, token_lora_mapping: tuple, lora_requests: set) -> None:
        if not self.lora_manager:
            raise RuntimeError("LoRA is not enabled.")
        self.lora_manager.set_active_adapters(lora_requests, LoRAMapping(token_lora_mapping, prompt_lora_mapping,
                                                                         is_prefill=True))

    def set_active_lora_for_request(self, lora_request: Optional[LoRARequest], num_tokens: int = 1) -> None:
        """``set_active_loras`` for the one request the stand-in runs (``input_batch.make_lora_inputs``)."""
        lora_id = lora_request.lora_int_id if lora_request else 0
        self._set_active_loras((lora_id,), (lora_id,) * num_tokens, {lora_request} if lora_request else set())

    def add_lora(self, lora_request: LoRARequest) -> bool:
        if not self.lora_manager:
            raise RuntimeError("LoRA is not enabled.")
        return self.lora_manager.add_adapter(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        if not self.lora_manager:
            raise RuntimeError("LoRA is not enabled.")
        return self.lora_manager.remove_adapter(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        if not self.lora_manager:
            raise RuntimeError("LoRA is not enabled.")
        return self.lora_manager._adapter_manager.pin_adapter(lora_id)

    def list_loras(self) -> set:
        if not self.lora_manager:
            raise RuntimeError("LoRA is not enabled.")
        return self.lora_manager.list_adapters()
