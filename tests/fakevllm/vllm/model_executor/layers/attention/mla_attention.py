"""Mirrors vllm/model_executor/layers/attention/mla_attention.py (0.24): ``MLAAttention`` and
the decode path that multiplies by the matrices its ``process_weights_after_loading`` derives.

vLLM's MLA (DeepSeek-V2/V3) keeps ``kv_b_proj`` = [W_UK; W_UV] per head. Prefill
(``forward_mha``) computes k_nope and v with ``kv_b_proj`` itself; decode (``forward_mqa``)
absorbs W_UK into the query (``torch.bmm(q_nope, self.W_UK_T)``) and W_UV into the output
(``torch.bmm(x, self.W_UV)``), over the latent cache of ALL tokens. ``W_UK_T`` / ``W_UV`` are
plain tensor attributes (neither parameters nor buffers), made once by
``process_weights_after_loading(act_dtype)`` from ``get_and_maybe_dequant_weights(kv_b_proj)``:
views of ``kv_b_proj.weight`` where the layer is unquantized, their own allocation where it is
quantized (``quant_utils``). vLLM runs that method after the initial load (``model_loader.utils.
process_weights_after_loading``) and in the layerwise reload's ``finalize`` -- never after a raw
``model.load_weights``.

Below 0.16 the matrices live on the attention implementation object (``self.impl``,
``MLACommonBaseImpl.process_weights_after_loading`` in 0.15.1), from 0.16 on the layer.
0.33 registers them as parameters (``replace_parameter``); not modelled. From 0.34 the method takes no
dtype (``process_weights_after_loading(self)``, mla_attention.py:1428, reading ``self.act_dtype``; 0.33:
``(self, act_dtype)``, :1242); ``attention.py`` likewise (0.34 :620, 0.33 :594). The loaders call it
through :func:`post_load`.

The fake attaches one ``MLAAttention`` to each transformers ``DeepseekV2Attention`` (as
``self_attn.mla_attn``, holding that attention's ``kv_b_proj`` like vLLM's layer) and turns the
``kv_b_proj`` Linear into :class:`DecodeAbsorbedLinear`: during a decode step (the runner sets
``decoding``) it multiplies by the derived matrices put back together, during prefill by the
weight. Decode steps recompute every token's k/v (no transformers KV cache), as the absorbed
decode reads the latent cache of every token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm import _fake
from vllm.model_executor.layers.quantization.utils.quant_utils import get_and_maybe_dequant_weights


class MLACommonBaseImpl:
    """Below 0.16: the backend implementation object that holds ``W_UK_T`` / ``W_UV``."""


class MLAAttention(torch.nn.Module):
    def __init__(self, num_heads: int, qk_nope_head_dim: int, v_head_dim: int, kv_lora_rank: int,
                 kv_b_proj: torch.nn.Module):
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.kv_b_proj = kv_b_proj
        self.impl = MLACommonBaseImpl() if _fake.V < _fake.Version("0.16.0") else None
        self.decoding = False
        self.act_dtype = kv_b_proj.weight.dtype  # upstream: the model config's dtype (the fake's: float32)

    def _holder(self):
        return self.impl if self.impl is not None else self

    def _process_upto_033(self, act_dtype: torch.dtype) -> None:
        self._derive(act_dtype)

    def _process_034(self) -> None:
        self._derive(self.act_dtype)

    process_weights_after_loading = _process_034 if _fake.V >= _fake.Version("0.34.0") else _process_upto_033

    def _derive(self, act_dtype: torch.dtype) -> None:
        kv_b_proj_weight = get_and_maybe_dequant_weights(self.kv_b_proj, out_dtype=act_dtype).T
        assert kv_b_proj_weight.shape == (
            self.kv_lora_rank, self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)), (
            f"{kv_b_proj_weight.shape=}, {self.kv_lora_rank=}, {self.num_heads=}")
        kv_b_proj_weight = kv_b_proj_weight.view(
            self.kv_lora_rank, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        W_UK, W_UV = kv_b_proj_weight.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        holder = self._holder()
        # Convert from (L, N, V) to (N, L, V)
        holder.W_UV = W_UV.transpose(0, 1)
        # Convert from (L, N, P) to (N, P, L)
        holder.W_UK_T = W_UK.permute(1, 2, 0)

    def absorbed_weight(self) -> torch.Tensor:
        """The [N*(P+V), L] matrix decode multiplies by: W_UK_T and W_UV put back per head."""
        holder = self._holder()
        per_head = torch.cat([holder.W_UK_T, holder.W_UV.transpose(1, 2)], dim=1)  # (N, P+V, L)
        return per_head.reshape(self.num_heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank)


def post_load(module, model_config) -> None:
    """An attention layer's own ``process_weights_after_loading``, as this release's loaders call it: with
    ``model_config.dtype`` up to 0.33 (``model_loader/utils.py``, ``reload/layerwise.py``), without arguments
    from 0.34 (``model_loader/weight_utils.py::finalize_model_weights`` calls ``hook()``)."""
    if _fake.V >= _fake.Version("0.34.0"):
        module.process_weights_after_loading()
    else:
        module.process_weights_after_loading(model_config.dtype)


class DecodeAbsorbedLinear(torch.nn.Linear):
    """``kv_b_proj`` of an MLA layer: the weight in prefill, the derived matrices in decode."""

    def forward(self, x):
        mla = self.__dict__.get("_mla")
        if mla is not None and mla.decoding:
            return F.linear(x, mla.absorbed_weight().to(x.dtype), self.bias)
        return super().forward(x)


def attach(model) -> list:
    """Give every transformers DeepSeek-V2/V3 attention of ``model`` its ``MLAAttention``."""
    layers = []
    for module in list(model.modules()):
        kv_b_proj = getattr(module, "kv_b_proj", None)
        if isinstance(module, MLAAttention) or not isinstance(kv_b_proj, torch.nn.Linear) \
                or not hasattr(module, "kv_lora_rank"):
            continue
        mla = MLAAttention(module.num_heads, module.qk_nope_head_dim, module.v_head_dim, module.kv_lora_rank,
                           kv_b_proj)
        module.mla_attn = mla
        kv_b_proj.__class__ = DecodeAbsorbedLinear
        object.__setattr__(kv_b_proj, "_mla", mla)  # not a submodule: no cycle in the module tree
        layers.append(mla)
    return layers
