"""Mirrors vllm/sequence.py (re-export of Logprob, kept by vLLM for BC)."""
from vllm.logprobs import Logprob, PromptLogprobs, SampleLogprobs  # noqa: F401
