"""Mirrors vllm/model_executor/layers/quantization/utils/quant_utils.py
``get_and_maybe_dequant_weights`` (0.24, lines ~398-458).

Unquantized layer (``quant_method`` None or ``UnquantizedLinearMethod``): ``weight.to(out_dtype)``,
which is the parameter ITSELF when the dtypes match (a bf16 model with bf16 activations), so
everything MLA derives from it is a view of the parameter's storage and follows any write into
it. Quantized layer: a dequantized copy (see ``quantization/fp8.py``).
"""
import torch

from vllm.model_executor.layers.linear import UnquantizedLinearMethod


def get_and_maybe_dequant_weights(layer, out_dtype: torch.dtype = torch.float32):
    while hasattr(layer, "base_layer") and hasattr(layer.base_layer, "quant_method"):
        layer = layer.base_layer
    weight = layer.weight
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is None or isinstance(quant_method, UnquantizedLinearMethod):
        return weight.to(out_dtype)
    return quant_method.dequantize(layer, out_dtype)
