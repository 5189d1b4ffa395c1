"""Mirrors vllm/engine/arg_utils.py EngineArgs (the keyword surface LLM(...)
accepts; unknown keywords raise TypeError like the dataclass does) and AsyncEngineArgs, its dataclass subclass."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from vllm import _fake
from vllm.config import CacheConfig, LoRAConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig


@dataclass
class EngineArgs:
    model: str = "facebook/opt-125m"
    tokenizer: Optional[str] = None
    tokenizer_mode: str = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    dtype: Any = "auto"
    quantization: Optional[str] = None
    quantization_config: Any = None  # 0.24 online quantization arguments; the stand-in quantizes every Linear
    revision: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    seed: Optional[int] = 0
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    enable_extensible_kv_cache: Optional[bool] = None
    swap_space: float = 4
    cpu_offload_gb: float = 0
    enforce_eager: bool = False
    max_seq_len_to_capture: Optional[int] = None
    max_model_len: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    enable_sleep_mode: bool = False
    distributed_executor_backend: Any = None
    load_format: str = "auto"
    model_impl: str = "auto"
    logprobs_mode: str = "raw_logprobs"
    max_logprobs: int = 20
    enable_prefix_caching: Optional[bool] = None
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 1
    enable_chunked_prefill: Optional[bool] = None
    disable_custom_all_reduce: bool = False
    disable_log_stats: bool = True
    limit_mm_per_prompt: Any = None
    mm_processor_kwargs: Any = None
    hf_overrides: Any = None
    compilation_config: Any = None
    additional_config: Any = None
    worker_extension_cls: str = ""
    kv_cache_dtype: str = "auto"
    block_size: Optional[int] = None
    structured_outputs_config: Any = None
    guided_decoding_backend: Any = None
    enable_expert_parallel: bool = False
    task: Any = None
    runner: Any = None
    disable_cascade_attn: bool = False
    async_scheduling: Any = None
    speculative_config: Any = None
    override_generation_config: Any = None
    generation_config: Any = "auto"
    allowed_local_media_path: str = ""
    reasoning_parser: str = ""
    enable_return_routed_experts: bool = False
    attention_backend: Any = None  # accepted; the stand-in has one attention path
    sleep_preserve_parameter_names: Any = None  # 0.33+ (a TypeError below 0.33, as an unknown keyword)

    def __post_init__(self):
        from vllm import _fake
        if self.sleep_preserve_parameter_names is not None and _fake.V < _fake.Version("0.33.0"):
            raise TypeError("EngineArgs.__init__() got an unexpected keyword argument 'sleep_preserve_parameter_names'")

    def create_engine_config(self) -> VllmConfig:
        mc = ModelConfig(model=str(self.model), tokenizer=self.tokenizer, dtype=self.dtype,
                         seed=self.seed or 0, max_model_len=self.max_model_len,
                         enable_sleep_mode=self.enable_sleep_mode, load_format=self.load_format,
                         trust_remote_code=self.trust_remote_code, logprobs_mode=self.logprobs_mode,
                         max_logprobs=self.max_logprobs, model_impl=self.model_impl,
                         quantization=self.quantization,
                         sleep_preserve_parameter_names=list(self.sleep_preserve_parameter_names or ()))
        cc = CacheConfig(gpu_memory_utilization=self.gpu_memory_utilization,
                         kv_cache_memory_bytes=self.kv_cache_memory_bytes,
                         num_gpu_blocks_override=self.num_gpu_blocks_override,
                         cache_dtype=self.kv_cache_dtype,
                         enable_extensible_kv_cache=_extensible_kv_cache(self),
                         enable_prefix_caching=True if self.enable_prefix_caching is None
                         else self.enable_prefix_caching)
        pc = ParallelConfig(tensor_parallel_size=self.tensor_parallel_size,
                            pipeline_parallel_size=self.pipeline_parallel_size,
                            data_parallel_size=self.data_parallel_size,
                            distributed_executor_backend=self.distributed_executor_backend,
                            world_size=self.tensor_parallel_size * self.pipeline_parallel_size)
        lc = LoRAConfig(self.max_lora_rank, self.max_loras) if self.enable_lora else None
        sc = self.speculative_config
        if isinstance(sc, dict):
            sc = SpeculativeConfig(**{k: v for k, v in sc.items() if k in ("method", "num_speculative_tokens", "model")})
        return VllmConfig(mc, cc, pc, lc, additional_config=self.additional_config or {}, speculative_config=sc)


@dataclass
class AsyncEngineArgs(EngineArgs):
    """Upstream: a dataclass subclass (its own generated ``__init__``, all of ``EngineArgs``' fields and its own)."""

    enable_log_requests: bool = False


def _extensible_kv_cache(args) -> bool:
    """0.34 ``VllmConfig._resolve_extensible_kv_cache``: on by default on CUDA unless the KV cache is sized
    by ``kv_cache_memory_bytes`` or ``num_gpu_blocks_override``; an explicit True where unsupported fails."""
    if _fake.V < _fake.Version("0.34.0"):
        return False
    unsupported = None
    if _fake.DEVICE_TYPE != "cuda":
        unsupported = "it is only supported on CUDA and ROCm"
    elif args.kv_cache_memory_bytes is not None:
        unsupported = "it sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides"
    elif args.num_gpu_blocks_override is not None:
        unsupported = "it sizes the KV cache from measured memory, which num_gpu_blocks_override overrides"
    if args.enable_extensible_kv_cache is None:
        return unsupported is None
    if args.enable_extensible_kv_cache and unsupported:
        raise ValueError(f"enable_extensible_kv_cache: {unsupported}")
    return bool(args.enable_extensible_kv_cache)
