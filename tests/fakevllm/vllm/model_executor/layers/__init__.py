"""Mirrors vllm/model_executor/layers (the parts the stand-in needs: fused MoE, MLA attention)."""
