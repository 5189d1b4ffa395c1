"""Mirrors vllm/config (ModelConfig, CacheConfig, ParallelConfig, VllmConfig):
only the fields the fake engine and TRL/ms-swift read."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ModelConfig:
    model: str
    tokenizer: Optional[str] = None
    dtype: Any = "auto"
    seed: int = 0
    max_model_len: Optional[int] = None
    enable_sleep_mode: bool = False
    load_format: str = "auto"
    trust_remote_code: bool = False
    logprobs_mode: str = "raw_logprobs"
    max_logprobs: int = 20
    model_impl: str = "auto"
    quantization: Optional[str] = None
    hf_config: Any = None
    sleep_preserve_parameter_names: list = field(default_factory=list)  # 0.33+ (config/model.py)

    def __post_init__(self):
        # vLLM resolves ``dtype`` to a torch.dtype (``_get_and_verify_dtype``); the fake runs every
        # model in float32, so that is its dtype whatever was asked (activations and weights agree).
        import torch
        self.dtype = torch.float32
        # vLLM reads the quantization from the checkpoint's config.json when none is passed
        # (``_verify_quantization``); the fake's stand-in for that config is FAKEVLLM_QUANTIZATION.
        if self.quantization is None:
            self.quantization = os.environ.get("FAKEVLLM_QUANTIZATION") or None
        if self.tokenizer is None:
            self.tokenizer = self.model
        if self.hf_config is None:
            try:
                from transformers import AutoConfig
                self.hf_config = AutoConfig.from_pretrained(self.model, trust_remote_code=self.trust_remote_code)
            except Exception:
                self.hf_config = None
        if self.max_model_len is None:
            self.max_model_len = int(getattr(self.hf_config, "max_position_embeddings", 2048) or 2048)

    @property
    def hf_text_config(self):
        return self.hf_config


@dataclass
class CacheConfig:
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    enable_extensible_kv_cache: Optional[bool] = None  # 0.34; resolved by EngineArgs.create_engine_config
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"
    block_size: int = 16


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: Any = None
    world_size: int = 1


@dataclass
class LoRAConfig:
    """vllm/config/lora.py (0.10.2): ``max_cpu_loras`` defaults to ``max_loras``; ``lora_dtype``
    "auto" becomes the model's dtype when the model loads (``verify_with_model_config``)."""
    max_lora_rank: int = 16
    max_loras: int = 1
    max_cpu_loras: Optional[int] = None
    lora_dtype: Any = "auto"
    lora_extra_vocab_size: int = 256
    bias_enabled: bool = False
    fully_sharded_loras: bool = False

    def __post_init__(self):
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras


@dataclass
class SpeculativeConfig:
    """vllm/config/speculative.py ``SpeculativeConfig`` (the engine arg ``speculative_config={"method": ...,
    "num_speculative_tokens": ...}``): the stand-in keeps the method and the token count."""
    method: Optional[str] = None
    num_speculative_tokens: int = 1
    model: Any = None

    def use_eagle(self) -> bool:
        """Upstream: the methods whose drafter is an ``EagleProposer`` (MTP included)."""
        return self.method in ("eagle", "eagle3", "mtp")


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    lora_config: Optional[LoRAConfig] = None
    quant_config: Any = None
    additional_config: dict = field(default_factory=dict)
    speculative_config: Optional[SpeculativeConfig] = None
