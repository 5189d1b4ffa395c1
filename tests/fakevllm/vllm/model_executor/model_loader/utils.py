"""Mirrors vllm/model_executor/model_loader/utils.py ``process_weights_after_loading`` (vLLM 0.24).

vLLM runs it once after a model's weights are loaded (and ms-swift 4.6's Megatron push calls it after
its ``load_weights``: ``swift.rlhf_trainers.utils.finish_vllm_weight_reload``): each module's
quantization method re-packs its weights, then the attention layers that post-process their weights
(MLA's ``W_UK_T`` / ``W_UV``) recompute them. Upstream moves each module to ``target_device`` for the
call (``device_loading_context``, for CPU offloading); the stand-in's modules are never offloaded.
The stand-in's models have neither quantization methods nor such attention layers, so on them it
changes nothing, as vLLM's does on an unquantized non-MLA model.
"""
from __future__ import annotations


def process_weights_after_loading(model, model_config, target_device) -> None:
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and hasattr(quant_method, "process_weights_after_loading"):
            quant_method.process_weights_after_loading(module)
    for _, module in model.named_modules():  # upstream: Attention / MLAAttention layers that define it
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading(model_config.dtype)
