"""Mirrors the importable module vllm/engine/async_llm_engine.py (ms-swift imports it to silence a
logger); the async engine itself is not part of the stand-in."""
import logging

logger = logging.getLogger(__name__)
