"""Mirrors the name vllm/model_executor/layers/attention/attention.py ``Attention``.

The fake's non-MLA models keep transformers' own attention modules, so no ``Attention``
instance is ever created; the class exists because vLLM's post-load code (``process_weights_
after_loading``, the layerwise reload's ``finalize``) and the code that mirrors it select the
attention layers with ``isinstance(module, (Attention, MLAAttention))``.
"""
import torch


class Attention(torch.nn.Module):
    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        return None
