"""Mirrors vllm/engine/async_llm_engine.py (V1: ``AsyncLLMEngine = AsyncLLM``, the whole module since V0 was
removed; 0.8-0.10 with ``VLLM_USE_V1`` the same alias). ms-swift imports it to silence a logger; OpenRLHF builds
its rollout engine as ``vllm.AsyncLLMEngine.from_engine_args``."""
import logging

from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

AsyncLLMEngine = AsyncLLM
