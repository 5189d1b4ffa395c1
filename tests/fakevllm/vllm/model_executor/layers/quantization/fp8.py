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


class _Fp8KVCacheMethod(QuantizeMethodBase):
    """Mirrors fp8.py ``Fp8KVCacheMethod`` (= quantization/kv_cache.py ``BaseKVCacheMethod``, read in the
    0.24.0 and 0.34.0 wheels): the quant method of an ``Attention`` layer of an fp8-quantized model.
    ``create_weights`` gives the layer the checkpoint's scale parameters ``q_scale`` / ``k_scale`` /
    ``v_scale`` / ``prob_scale`` at the sentinel -1.0; ``process_weights_after_loading`` derives from them
    what the kernels read: the buffers ``_k_scale`` ... (filled in place), the host floats
    ``_k_scale_float`` ... and, 0.34, the host tensors ``_k_scale_cpu`` / ``_v_scale_cpu``. 0.24 then
    deletes the four parameters (a later push finds none to write); 0.34 keeps them (the release in between
    that stopped deleting them is not located: the stand-in switches at 0.34). Not modelled: fp8 fnuz
    doubling, per-token-head scales, ``calculate_kv_scales``. Private here: a public name would be a claim
    on every release's facts (tests/support/vllm_facts.py)."""

    SCALES = ("q_scale", "k_scale", "v_scale", "prob_scale")

    def create_weights(self, layer) -> None:
        for name in self.SCALES:
            setattr(layer, name, torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False))

    def process_weights_after_loading(self, layer) -> None:
        from vllm import _fake

        if not hasattr(layer, "q_scale"):  # upstream: no weights to process (deleted after the first load)
            return
        if layer.kv_cache_dtype.startswith("fp8"):  # is_quantized_kv_cache
            if layer.k_scale > 0.0 and layer.v_scale > 0.0:
                k_scale, v_scale = layer.k_scale.item(), layer.v_scale.item()
            elif layer.k_scale < 0.0 and layer.v_scale < 0.0:
                k_scale = v_scale = 1.0
            else:  # one kv_scale in the checkpoint, remapped to k_scale: duplicated
                k_scale = v_scale = max(layer.k_scale, layer.v_scale).item()
            if layer.q_scale < 0.0:
                layer._q_scale.copy_(k_scale)
                layer._q_scale_float = k_scale
            layer._k_scale.copy_(k_scale)
            layer._v_scale.copy_(v_scale)
            layer._k_scale_float = k_scale
            layer._v_scale_float = v_scale
            if _fake.V >= _fake.Version("0.34.0"):
                layer._k_scale_cpu.fill_(k_scale)
                layer._v_scale_cpu.fill_(v_scale)
        q_scale = layer.q_scale.item() if layer.q_scale > 0.0 else 1.0
        prob_scale = layer.prob_scale.item() if layer.prob_scale > 0.0 else 1.0
        layer._q_scale.copy_(q_scale)
        layer._q_scale_float = q_scale
        layer._prob_scale.copy_(prob_scale)
        if _fake.V < _fake.Version("0.34.0"):
            for name in self.SCALES:
                delattr(layer, name)
