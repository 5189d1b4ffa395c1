"""Mirrors vllm/sampling_params.py: SamplingParams, StructuredOutputsParams
(>= 0.10.2), GuidedDecodingParams (< 0.12, removed afterwards), RequestOutputKind.

The fake stores the fields and validates like upstream's ``_verify_args``
(subset); structured outputs are accepted but not enforced by the fake sampler.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Optional

from vllm import _fake


class RequestOutputKind(IntEnum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    json: Optional[Any] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None
    structural_tag: Optional[str] = None

    def __post_init__(self):
        n = sum(x is not None for x in (self.json, self.regex, self.choice, self.grammar,
                                        self.json_object, self.structural_tag))
        if n > 1:
            raise ValueError("You can only use one kind of structured outputs constraint but multiple "
                             f"are specified: {self.__dict__}")


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    backend: Optional[str] = None


_FIELDS = dict(
    n=1, best_of=None, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
    temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None, stop_token_ids=None,
    ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None, prompt_logprobs=None,
    detokenize=True, skip_special_tokens=True, spaces_between_special_tokens=True,
    logits_processors=None, include_stop_str_in_output=False, truncate_prompt_tokens=None,
    output_kind=RequestOutputKind.CUMULATIVE, logit_bias=None, allowed_token_ids=None,
    extra_args=None, bad_words=None, bad_words_token_ids=None, skip_reading_prefix_cache=None,
    flat_logprobs=False, repetition_detection=None, thinking_token_budget=None,
)
if _fake.V >= _fake.Version("0.10.2"):
    _FIELDS["structured_outputs"] = None
if _fake.V < _fake.Version("0.12.0"):
    _FIELDS["guided_decoding"] = None
else:
    del GuidedDecodingParams


class SamplingParams:
    """Keyword-only like upstream's msgspec Struct: unknown keywords raise TypeError."""

    def __init__(self, **kwargs):
        unknown = set(kwargs) - set(_FIELDS)
        if unknown:
            raise TypeError(f"Unexpected keyword argument(s) {sorted(unknown)!r} for SamplingParams")
        for k, v in _FIELDS.items():
            setattr(self, k, copy.copy(v) if isinstance(v, (list, dict)) else v)
        for k, v in kwargs.items():
            setattr(self, k, v)
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if self.top_k is None:
            self.top_k = 0
        if self.top_p is None:
            self.top_p = 1.0
        if self.min_p is None:
            self.min_p = 0.0
        if self.repetition_penalty is None:
            self.repetition_penalty = 1.0
        if self.logprobs is True:
            self.logprobs = 1
        self._verify_args()

    @classmethod
    def from_optional(cls, **kwargs):
        return cls(**{k: v for k, v in kwargs.items() if v is not None})

    def _verify_args(self):
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int and at least 1, got {self.n}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k < -1:
            raise ValueError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative or -1, got {self.logprobs}.")

    @property
    def sampling_type(self) -> str:
        return "greedy" if self.temperature < 1e-5 else ("seeded" if self.seed is not None else "random")

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def __repr__(self):
        return "SamplingParams(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _FIELDS) + ")"
