"""Mirrors vllm/lora/peft_helper.py ``PEFTHelper`` (0.10.2): the adapter's PEFT config
(``from_dict`` keeps the known fields, ``from_local_dir`` reads ``adapter_config.json``),
the scaling factor ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA) and
``validate_legal`` (rank within ``max_lora_rank``, no bias without ``bias_enabled``,
no ``modules_to_save``, no DoRA). Tensorizer configs are not supported.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Optional, Union


@dataclass
class PEFTHelper:
    r: int
    lora_alpha: int
    target_modules: Union[list, str, set]
    bias: str = field(default="none")
    modules_to_save: Optional[list] = field(default=None)
    use_rslora: bool = field(default=False)
    use_dora: bool = field(default=False)
    vllm_lora_scaling_factor: float = field(default=1.0)
    vllm_max_position_embeddings: Optional[int] = field(default=False)

    def _validate_features(self) -> list:
        error_msg = []
        if self.modules_to_save:
            error_msg.append("vLLM only supports modules_to_save being None.")
        if self.use_dora:
            error_msg.append("vLLM does not yet support DoRA.")
        return error_msg

    def __post_init__(self):
        if self.use_rslora:
            self.vllm_lora_scaling_factor = self.lora_alpha / math.sqrt(self.r)
        else:
            self.vllm_lora_scaling_factor = self.lora_alpha / self.r

    @classmethod
    def from_dict(cls, config_dict: dict) -> "PEFTHelper":
        class_fields = {f.name: f for f in fields(cls)}
        required = {n for n, f in class_fields.items() if f.default is MISSING and f.default_factory is MISSING}
        missing = required - set(config_dict)
        if missing:
            raise ValueError(f"Missing required configuration fields: {missing}")
        return cls(**{k: v for k, v in config_dict.items() if k in class_fields})

    @classmethod
    def from_local_dir(cls, lora_path: str, max_position_embeddings: Optional[int],
                       tensorizer_config_dict: Optional[dict] = None) -> "PEFTHelper":
        with open(os.path.join(lora_path, "adapter_config.json")) as f:
            config = json.load(f)
        config["vllm_max_position_embeddings"] = max_position_embeddings
        return cls.from_dict(config)

    def validate_legal(self, lora_config) -> None:
        error_msg = self._validate_features()
        if self.r > lora_config.max_lora_rank:
            error_msg.append(f"LoRA rank {self.r} is greater than max_lora_rank {lora_config.max_lora_rank}.")
        if self.bias != "none" and not lora_config.bias_enabled:
            error_msg.append("Adapter bias cannot be used without bias_enabled.")
        if error_msg:
            raise ValueError(f"{' '.join(error_msg)}")
