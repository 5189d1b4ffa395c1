"""Mirrors vllm/entrypoints/harmony_utils.py (vLLM 0.12; ``entrypoints/openai/parser/harmony_utils.py`` from
0.13) by name: ``get_encoding`` (gpt-oss's harmony encoding) is not modelled."""


def get_encoding():
    raise NotImplementedError("the vLLM stand-in has no harmony encoding")
