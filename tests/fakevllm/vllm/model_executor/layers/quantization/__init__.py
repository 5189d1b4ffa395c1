"""Mirrors vllm/model_executor/layers/quantization (subset)."""
