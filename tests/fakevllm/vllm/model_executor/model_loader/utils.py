"""Mirrors vllm/model_executor/model_loader/utils.py ``process_weights_after_loading`` (0.24):
every module's ``quant_method.process_weights_after_loading(module)``, then every attention
layer's ``process_weights_after_loading(model_config.dtype)`` (after the others, so that they can
decompress weights). vLLM's loader runs it once after the initial load (``BaseModelLoader.
load_model``); ms-swift's ``finish_vllm_weight_reload`` calls it after its pushes. The
``device_loading_context`` (CPU offloading) is not modelled.
"""
from __future__ import annotations


def process_weights_after_loading(model, model_config, target_device) -> None:
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(module)
    from vllm.model_executor.layers.attention.mla_attention import post_load

    for _, module in model.named_modules():  # upstream: the Attention / MLAAttention layers (they define it)
        if hasattr(module, "process_weights_after_loading"):
            post_load(module, model_config)  # 0.34: through finalize_model_weights, without a dtype
