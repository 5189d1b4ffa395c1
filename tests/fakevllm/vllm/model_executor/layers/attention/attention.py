"""Mirrors the name vllm/model_executor/layers/attention/attention.py ``Attention``.

The fake's non-MLA models keep transformers' own attention modules, so no ``Attention``
instance is ever created; the class exists because vLLM's post-load code (``process_weights_
after_loading``, the layerwise reload's ``finalize``) and the code that mirrors it select the
attention layers with ``isinstance(module, (Attention, MLAAttention))``.
"""
import torch

from vllm import _fake


class Attention(torch.nn.Module):
    def _process_upto_033(self, act_dtype: torch.dtype) -> None:
        return None

    def _process_034(self) -> None:
        return None

    # 0.34: ``process_weights_after_loading(self)`` (attention.py:620); up to 0.33 ``(self, act_dtype)`` (:594)
    process_weights_after_loading = _process_034 if _fake.V >= _fake.Version("0.34.0") else _process_upto_033
