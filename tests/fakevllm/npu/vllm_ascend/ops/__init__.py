"""Mirrors vllm_ascend/ops (the parts the stand-in needs)."""
