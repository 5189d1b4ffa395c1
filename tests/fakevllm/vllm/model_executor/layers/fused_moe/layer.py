"""Mirrors vllm/model_executor/layers/fused_moe/layer.py: where upstream defines ``FusedMoE`` (the package
re-exports it; verl's fp8 utils import it from here)."""
from vllm.model_executor.layers.fused_moe import FusedMoE  # noqa: F401
