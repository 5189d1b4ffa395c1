"""Mirrors vllm/lora/request.py ``LoRARequest`` (0.10.2): a ``msgspec.Struct``
(``omit_defaults=True, array_like=True``) so that ms-swift's ``TensorLoRARequest``
(``swift/trainers/rlhf_trainer/utils.py``) can subclass it with ``msgspec.field``
fields; ``__post_init__`` asserts a non-empty ``lora_path``; equality and hash by
``lora_name``. From 0.15.0 ``load_inplace`` (vLLM 0.24.0 request.py: reload an adapter
whose ``lora_int_id`` is already registered, ``LRUCacheWorkerLoRAManager.add_adapter``).
Where msgspec is not installed (vLLM depends on it; the TRL test
environment does not have it) the fields are kept as a plain dataclass.
"""
from typing import Optional

from vllm import _fake

_LOAD_INPLACE = _fake.V >= _fake.Version("0.15.0")

try:
    import msgspec
except ImportError:  # pragma: no cover - environment without msgspec (TRL tests)
    msgspec = None


class _Props:
    @property
    def adapter_id(self):
        return self.lora_int_id

    @property
    def name(self):
        return self.lora_name

    @property
    def path(self):
        return self.lora_path

    def __eq__(self, value: object) -> bool:  # by lora_name (identifies an adapter across engines)
        return isinstance(value, self.__class__) and self.lora_name == value.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)


if msgspec is not None:
    class LoRARequest(_Props, msgspec.Struct, omit_defaults=True, array_like=True):
        lora_name: str
        lora_int_id: int
        lora_path: str = ""
        lora_local_path: Optional[str] = msgspec.field(default=None)
        long_lora_max_len: Optional[int] = None
        base_model_name: Optional[str] = msgspec.field(default=None)
        tensorizer_config_dict: Optional[dict] = None
        if _LOAD_INPLACE:
            load_inplace: bool = False

        def __post_init__(self):
            if self.lora_local_path and not self.lora_path:
                self.lora_path = self.lora_local_path or ""
            assert self.lora_path, "lora_path cannot be empty"

        __eq__, __hash__ = _Props.__eq__, _Props.__hash__  # msgspec.Struct defines its own otherwise
else:
    from dataclasses import dataclass

    @dataclass(eq=False)
    class LoRARequest(_Props):
        lora_name: str
        lora_int_id: int
        lora_path: str = ""
        lora_local_path: Optional[str] = None
        long_lora_max_len: Optional[int] = None
        base_model_name: Optional[str] = None
        tensorizer_config_dict: Optional[dict] = None
