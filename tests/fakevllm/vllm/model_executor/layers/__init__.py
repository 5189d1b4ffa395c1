"""Mirrors vllm/model_executor/layers (the parts the fake's MLA models need)."""
