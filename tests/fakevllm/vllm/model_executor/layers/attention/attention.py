"""Mirrors vllm/model_executor/layers/attention/attention.py ``Attention`` (read in the 0.24.0 and 0.34.0
wheels) as far as its KV-cache scales go.

vLLM's post-load code (``process_weights_after_loading``, the layerwise reload's ``finalize``) and the
code that mirrors it select the attention layers with ``isinstance(module, (Attention, MLAAttention))``.
The fake's non-MLA models keep transformers' own attention modules; only an engine built with an fp8 KV
cache (``kv_cache_dtype="fp8..."``) gets, by :func:`_attach`, one ``Attention`` per transformers
attention (as ``self_attn.attn``, vLLM's name) carrying what upstream's ``_init_kv_cache_quant`` gives
it: the buffers ``_q_scale`` / ``_k_scale`` / ``_v_scale`` / ``_prob_scale`` at 1.0 with their host
copies (``set_default_quant_scales``) and, where the model is quantized (fp8: ``Fp8KVCacheMethod``,
``quantization/fp8.py``), ``quant_method`` and the scale parameters it creates. Upstream builds the layer
for every model; the stand-in's forward does not run through it (nothing reads the scales but tests).
``process_weights_after_loading`` runs the backend's (the stand-in's one backend derives nothing), then
resets the scales to 1.0 where the layer loads no quantized weights; the scales are derived by the
quant method, which the loaders call (``model_loader.utils``, the reload's ``_reload_attention_scales``).
"""
import torch

from vllm import _fake


def _set_default_quant_scales(layer, register_buffer: bool = False) -> None:
    """``set_default_quant_scales`` (0.34; 0.24 has no ``_k_scale_cpu``)."""
    for name in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
        if register_buffer:
            layer.register_buffer(name, torch.tensor(1.0, dtype=torch.float32))
        else:
            getattr(layer, name).fill_(1.0)
    layer._q_scale_float = layer._k_scale_float = layer._v_scale_float = layer._prob_scale_float = 1.0
    if _fake.V >= _fake.Version("0.34.0"):
        layer._k_scale_cpu = torch.tensor(1.0, dtype=torch.float32)
        layer._v_scale_cpu = torch.tensor(1.0, dtype=torch.float32)


class Attention(torch.nn.Module):
    def _post_load(self) -> None:
        # self.impl.process_weights_after_loading(act_dtype): the stand-in's one backend derives nothing
        if "_k_scale" in self._buffers and getattr(self, "quant_method", None) is None:
            _set_default_quant_scales(self, register_buffer=False)  # not should_load_quant_weights

    def _process_upto_033(self, act_dtype: torch.dtype) -> None:
        self._post_load()

    def _process_034(self) -> None:
        self._post_load()

    # 0.34: ``process_weights_after_loading(self)`` (attention.py:620); up to 0.33 ``(self, act_dtype)`` (:594)
    process_weights_after_loading = _process_034 if _fake.V >= _fake.Version("0.34.0") else _process_upto_033


def _attach(model, kv_cache_dtype: str, quantized: bool) -> list:
    """One ``Attention`` per transformers attention of ``model`` (``k_proj`` and ``v_proj``, not MLA) as its
    ``attn``, with ``_init_kv_cache_quant``'s scales; returns them. Nothing unless the KV cache is fp8."""
    if not kv_cache_dtype.startswith("fp8"):
        return []
    from vllm.model_executor.layers.quantization.fp8 import _Fp8KVCacheMethod

    layers = []
    for module in list(model.modules()):
        if isinstance(module, Attention) or hasattr(module, "kv_lora_rank") \
                or not all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("k_proj", "v_proj")):
            continue
        attn = Attention()
        attn.kv_cache_dtype = kv_cache_dtype
        attn.calculate_kv_scales = False
        _set_default_quant_scales(attn, register_buffer=True)
        if quantized:
            attn.quant_method = _Fp8KVCacheMethod()
            attn.quant_method.create_weights(attn)
        module.attn = attn
        layers.append(attn)
    return layers
