"""Mirrors vllm/model_executor/layers/quantization/base_config.py ``QuantizeMethodBase``."""


class QuantizeMethodBase:
    def process_weights_after_loading(self, layer) -> None:
        """Process the weight after loading (vLLM: repacking, quantizing, ...)."""
        return None
