"""Mirrors vllm/model_executor/layers/quantization/fp8.py ``Fp8LinearMethod`` and the online
``Fp8PerTensorOnlineLinearMethod`` (0.24) only as far as the MLA derivation sees them.

What is modelled: ``get_and_maybe_dequant_weights`` of a quantized layer returns a dequantized
COPY (``scaled_dequantize``: a new device allocation), so the ``W_UK_T`` / ``W_UV`` that
``MLAAttention.process_weights_after_loading`` derives from ``kv_b_proj`` are their own
tensors, not views of the parameter.

What is NOT modelled: the fp8 numbers and the kernel layout. vLLM's online fp8 replaces the
weight by its fp8 transpose (``replace_parameter(layer, "weight", qweight.t())``) plus a
``weight_scale``, so a raw ``model.load_weights`` of a bf16 tensor there fails on the shape
(non-square) or writes unscaled values; the fake keeps the checkpoint layout in float32, so a
raw push writes the weight itself and only the derived matrices go stale.
"""
import torch

from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase


class Fp8LinearMethod(QuantizeMethodBase):
    def process_weights_after_loading(self, layer) -> None:
        return None  # kernel format == checkpoint format in the fake (module docstring)

    def dequantize(self, layer, out_dtype) -> torch.Tensor:
        """``scaled_dequantize(weight, scale, ...)``: a new tensor on the device."""
        from vllm._fake.device import DEVICE

        return DEVICE.track(layer.weight.detach().to(out_dtype).clone(), label="fp8_dequant")
