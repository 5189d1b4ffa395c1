"""Mirrors vllm/model_executor/layers/attention/__init__.py (``Attention``, ``MLAAttention``)."""
from vllm.model_executor.layers.attention.attention import Attention
from vllm.model_executor.layers.attention.mla_attention import MLAAttention

__all__ = ["Attention", "MLAAttention"]
