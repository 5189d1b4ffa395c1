"""Mirrors vllm/logprobs.py (0.11+; earlier vllm/sequence.py): ``Logprob``,
``PromptLogprobs``, ``SampleLogprobs`` (list[dict[int, Logprob]])."""
from dataclasses import dataclass
from typing import Optional


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


PromptLogprobs = list[Optional[dict[int, Logprob]]]
SampleLogprobs = list[dict[int, Logprob]]
