"""Mirrors vllm/lora/request.py LoRARequest."""
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_local_path: Optional[str] = None
    long_lora_max_len: Optional[int] = None
    base_model_name: Optional[str] = None
    tensorizer_config_dict: Optional[dict] = None

    @property
    def adapter_id(self):
        return self.lora_int_id

    @property
    def name(self):
        return self.lora_name

    @property
    def path(self):
        return self.lora_path
