"""Mirrors vllm/engine/llm_engine.py, which re-exports the v1 LLMEngine."""
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: F401
