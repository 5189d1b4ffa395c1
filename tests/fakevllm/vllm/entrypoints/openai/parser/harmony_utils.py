"""Mirrors vllm/entrypoints/openai/parser/harmony_utils.py (vLLM >= 0.13) by name: see
``vllm.entrypoints.harmony_utils``."""
from vllm.entrypoints.harmony_utils import get_encoding  # noqa: F401
