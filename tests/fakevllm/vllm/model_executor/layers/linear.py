"""Mirrors vllm/model_executor/layers/linear.py ``UnquantizedLinearMethod`` (0.24): what every
``LinearBase`` of an unquantized model holds as ``quant_method``; its
``process_weights_after_loading`` leaves the weight as loaded.

The fake keeps transformers' ``nn.Linear`` modules and sets ``quant_method`` on each at load
(``GPUModelRunner.load_model``), as vLLM's ``LinearBase.__init__`` does; so ``LinearBase`` (the base of
every vLLM linear layer, which verl's fp8 utils import) is ``nn.Linear`` here.
"""
from torch import nn

from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

LinearBase = nn.Linear


class UnquantizedLinearMethod(QuantizeMethodBase):
    def process_weights_after_loading(self, layer) -> None:
        return None
