"""Mirrors vllm/outputs.py: CompletionOutput, RequestOutput (fields TRL and
ms-swift read), PoolingRequestOutput (placeholder)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from vllm.logprobs import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[SampleLogprobs]
    finish_reason: Optional[str] = None
    stop_reason: Any = None
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    def __init__(self, request_id: str, prompt: Optional[str], prompt_token_ids: list[int],
                 prompt_logprobs: Optional[PromptLogprobs], outputs: list[CompletionOutput],
                 finished: bool, metrics: Any = None, lora_request: Any = None,
                 encoder_prompt: Optional[str] = None, encoder_prompt_token_ids=None,
                 num_cached_tokens: Optional[int] = 0, *, multi_modal_placeholders=None,
                 kv_transfer_params=None, **kwargs):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.multi_modal_placeholders = multi_modal_placeholders or {}
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.kv_transfer_params = kv_transfer_params

    def __repr__(self):
        return (f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, "
                f"finished={self.finished})")


class PoolingRequestOutput:
    def __init__(self, request_id, outputs, prompt_token_ids, finished):
        self.request_id = request_id
        self.outputs = outputs
        self.prompt_token_ids = prompt_token_ids
        self.finished = finished
