"""Mirrors vllm/lora/models.py (0.10.2) with the LRU cache of
vllm/adapter_commons/models.py: ``LoRAModel`` (an adapter's per-module weights on the
CPU; ``from_lora_tensors`` parses PEFT names, transposes ``lora_A``/``lora_B`` and folds
the scaling into ``lora_b``), ``LoRAModelManager`` (replaces the supported modules by
LoRA layers at model load, keeps the registered adapters and which GPU slot each active
one occupies: ``activate_adapter`` copies an adapter into a free slot, nothing copies it
again while it stays active), ``LRUCacheLoRAModelManager`` (capacity ``max_cpu_loras``;
the oldest adapter is evicted, and deactivated, when a new one is added) and
``create_lora_manager``.

The manager's bookkeeping lives on the CPU and survives a sleep; the slots are device
memory of the "weights" tag (``vllm.lora.layers``): after a level-2 sleep an adapter the
manager still counts as active computes with whatever the slot holds.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable, Optional

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.lora.layers import LinearWithLoRA, LoRAMapping, PunicaWrapper
from vllm.lora.lora import LoRALayerWeights
from vllm.lora.utils import from_layer, get_supported_lora_modules, parse_fine_tuned_lora_name, replace_submodule

logger = init_logger(__name__)


class LoRAModel:
    """A LoRA fine-tuned model."""

    def __init__(self, lora_model_id: int, rank: int, loras: dict) -> None:
        self.id = lora_model_id
        assert lora_model_id > 0, f"a valid lora id should be greater than 0, got {self.id}"
        self.rank = rank
        self.loras: dict = loras

    def clone(self, lora_model_id: int) -> "LoRAModel":
        return self.__class__(lora_model_id, rank=self.rank, loras=self.loras.copy())

    @property
    def extra_vocab_size(self) -> int:
        return max(lora.extra_vocab_size for lora in self.loras.values()) if self.loras else 0

    def get_lora(self, module_name: str) -> Optional[LoRALayerWeights]:
        return self.loras.get(module_name, None)

    def check_lora_name(self, lora_name: str) -> bool:
        return lora_name in self.loras

    @classmethod
    def from_lora_tensors(cls, lora_model_id: int, tensors: dict, peft_helper, device: str = "cuda",
                          dtype: Optional[torch.dtype] = None, embeddings: Optional[dict] = None,
                          target_embedding_padding: Optional[int] = None,
                          embedding_modules: Optional[dict] = None,
                          embedding_padding_modules: Optional[list] = None, weights_mapper=None) -> "LoRAModel":
        loras: dict = {}
        # vLLM: the trainer's tensors are on the GPU, ``.to("cpu")`` copies them (and pins the copy); here they are
        # CPU tensors already and ``.to`` would return them as they are -- ``optimize()`` would then scale the
        # trainer's own lora_B in place. Copied as on the GPU.
        tensors = {name: t.detach().clone() for name, t in tensors.items()}
        for tensor_name, tensor in tensors.items():
            module_name, is_lora_a, is_bias = parse_fine_tuned_lora_name(tensor_name, weights_mapper)
            if module_name not in loras:
                loras[module_name] = LoRALayerWeights.from_config(module_name, peft_helper, None)
            if is_bias:
                loras[module_name].bias = tensor.to(device=device, dtype=dtype).t()
            elif is_lora_a:
                loras[module_name].lora_a = tensor.to(device=device, dtype=dtype).t()
            else:
                loras[module_name].lora_b = tensor.to(device=device, dtype=dtype).t()
                assert embedding_padding_modules is not None
        for lora in loras.values():
            lora.optimize()
        return cls(lora_model_id, peft_helper.r, loras)

    @classmethod
    def from_local_checkpoint(cls, lora_dir: str, expected_lora_modules: list, peft_helper, *,
                              lora_model_id: Optional[int] = None, device: str = "cuda",
                              dtype: Optional[torch.dtype] = None, target_embedding_padding: Optional[int] = None,
                              embedding_modules: Optional[dict] = None,
                              embedding_padding_modules: Optional[list] = None,
                              weights_mapper=None, tensorizer_config_dict=None) -> "LoRAModel":
        st = os.path.join(lora_dir, "adapter_model.safetensors")
        if os.path.isfile(st):
            from safetensors.torch import load_file
            tensors = load_file(st)
        else:
            tensors = torch.load(os.path.join(lora_dir, "adapter_model.bin"), map_location=device,
                                 weights_only=True)
        return cls.from_lora_tensors(lora_model_id=lora_model_id, tensors=tensors, peft_helper=peft_helper,
                                     device=device, dtype=dtype, target_embedding_padding=target_embedding_padding,
                                     embedding_modules=embedding_modules,
                                     embedding_padding_modules=embedding_padding_modules,
                                     weights_mapper=weights_mapper)


class AdapterLRUCache(OrderedDict):
    """vllm/adapter_commons/models.py ``AdapterLRUCache``: removing an entry calls ``deactivate_fn``."""

    def __init__(self, capacity: int, deactivate_fn: Callable[[int], object]):
        super().__init__()
        self.capacity = capacity
        self.deactivate_fn = deactivate_fn

    @property
    def cache(self):
        return self

    def touch(self, key) -> None:
        if key in self:
            self.move_to_end(key)

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.remove_oldest()

    def remove_oldest(self) -> None:
        if len(self):
            key = next(iter(self))
            self.deactivate_fn(key)
            super().pop(key, None)

    def pop(self, key, default=None):
        if key in self:
            self.deactivate_fn(key)
        return super().pop(key, default)


def _pop(cache, key):
    """Remove ``key`` without the LRU cache's ``deactivate_fn`` (vLLM pops its ``LRUCache`` through the
    underlying cache); an ``OrderedDict`` through its own ``pop`` (``dict.pop`` would leave its order list
    holding the key: a later ``move_to_end`` raises ``KeyError``)."""
    return (OrderedDict.pop if isinstance(cache, OrderedDict) else dict.pop)(cache, key, None)


class LoRAModelManager:
    """A manager that manages multiple LoRA-fine-tuned models."""

    def __init__(self, model: nn.Module, max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int,
                 lora_config, device) -> None:
        self.lora_config = lora_config
        self.device = device
        self.max_num_seqs = max_num_seqs
        assert self.capacity >= self.lora_slots
        self.lora_index_to_id: list = [None] * self.lora_slots
        self.vocab_size = vocab_size
        self.punica_wrapper = PunicaWrapper()
        self.model = model
        self._registered_adapters: dict = {}
        self._active_adapters: dict = {}
        self._last_mapping = None
        self.supported_lora_modules = get_supported_lora_modules(self.model)
        assert self.supported_lora_modules, f"No supported LoRA modules found in {type(self.model).__name__}."
        self.packed_modules_mapping = dict(getattr(self.model, "packed_modules_mapping", {}) or {})
        self.packed_modules: dict = {}
        self.modules: dict = {}
        self._create_lora_modules()
        self.model.lora_manager = self
        self.adapter_type = "LoRA"

    def __len__(self) -> int:
        return len(self._registered_adapters)

    @property
    def capacity(self) -> int:
        return self.lora_config.max_cpu_loras

    @property
    def lora_slots(self) -> int:
        return self.lora_config.max_loras

    @property
    def adapter_slots(self) -> int:
        return self.lora_slots

    def activate_adapter(self, lora_id: int) -> bool:
        """Move LoRA into a GPU buffer to be used in the forward pass."""
        if lora_id in self._active_adapters:
            return False
        first_free_slot = next(((i, x) for i, x in enumerate(self.lora_index_to_id) if x is None), None)
        if first_free_slot is None:
            raise ValueError("No free lora slots")
        index, _ = first_free_slot
        self._active_adapters[lora_id] = None
        lora_model = self._registered_adapters[lora_id]
        self.lora_index_to_id[index] = lora_model.id
        for module_name, module in self.modules.items():
            module_lora = lora_model.get_lora(module_name)
            if module_lora:
                module_lora.optimize()
                if module_lora.bias is not None and not self.lora_config.bias_enabled:
                    module_lora.bias = None
                    raise ValueError(f"Adapter bias cannot be used for {module_name} without --enable-lora-bias.")
                module.set_lora(index, module_lora.lora_a, module_lora.lora_b, module_lora.embeddings_tensor,
                                module_lora.bias)
            else:
                module.reset_lora(index)
        return True

    def _deactivate_adapter(self, lora_id: int) -> None:
        try:
            index = self.lora_index_to_id.index(lora_id)
            self.lora_index_to_id[index] = None
        except ValueError:
            pass

    def deactivate_adapter(self, adapter_id: int) -> bool:
        if adapter_id in self._active_adapters:
            self._deactivate_adapter(adapter_id)
            _pop(self._active_adapters, adapter_id)
            return True
        return False

    def _add_adapter(self, lora: LoRAModel) -> None:
        self._registered_adapters[lora.id] = lora

    def add_adapter(self, adapter: LoRAModel) -> bool:
        if adapter.id not in self._registered_adapters:
            if len(self._registered_adapters) >= self.capacity:
                raise RuntimeError("No free adapter slots.")
            self._add_adapter(adapter)
            return True
        return False

    def set_adapter_mapping(self, mapping: Optional[LoRAMapping]) -> None:
        """punica's metadata: the slot of the (one) adapter the running request uses."""
        ids = set(mapping.prompt_mapping) - {0} if mapping is not None else set()
        assert len(ids) <= 1, "the stand-in runs one request at a time"
        lora_id = next(iter(ids), None)
        self.punica_wrapper.index = self.lora_index_to_id.index(lora_id) if lora_id is not None else -1
        self._last_mapping = mapping

    def remove_adapter(self, adapter_id: int) -> bool:
        self.deactivate_adapter(adapter_id)
        return bool(_pop(self._registered_adapters, adapter_id))

    def remove_all_adapters(self) -> None:
        (OrderedDict.clear if isinstance(self._registered_adapters, OrderedDict) else dict.clear)(
            self._registered_adapters)
        self.lora_index_to_id = [None] * self.lora_slots
        (OrderedDict.clear if isinstance(self._active_adapters, OrderedDict) else dict.clear)(self._active_adapters)

    def list_adapters(self) -> dict:
        return dict(self._registered_adapters)

    def get_adapter(self, adapter_id: int):
        return self._registered_adapters.get(adapter_id)

    def _create_lora_modules(self) -> None:
        for module_name, module in list(self.model.named_modules(remove_duplicate=False)):
            if not module_name or module_name.split(".")[-1] not in self.supported_lora_modules:
                continue
            parts = module_name.split(".")[-1]
            new_module = replace_submodule(self.model, module_name,
                                           from_layer(module, self.lora_slots, self.lora_config,
                                                      self.packed_modules_mapping.get(parts, []),
                                                      getattr(self.model, "config", None)))
            if not isinstance(new_module, LinearWithLoRA):
                continue
            self.modules[module_name] = new_module
            new_module.set_mapping(self.punica_wrapper)


class LRUCacheLoRAModelManager(LoRAModelManager):
    """A model manager that manages multiple LoRAs with LRU cache."""

    def __init__(self, model: nn.Module, max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int,
                 lora_config, device) -> None:
        super().__init__(model, max_num_seqs, max_num_batched_tokens, vocab_size, lora_config, device)
        self._registered_adapters = AdapterLRUCache(self.capacity, self.deactivate_adapter)
        self._active_adapters = AdapterLRUCache(self.lora_slots, self._deactivate_adapter)

    def list_adapters(self) -> dict:
        return dict(self._registered_adapters.cache)

    def add_adapter(self, lora: LoRAModel) -> bool:
        if lora.id not in self._registered_adapters:
            self._add_adapter(lora)
            return True
        self._registered_adapters.touch(lora.id)
        return False

    def activate_adapter(self, lora_id: int) -> bool:
        if lora_id not in self._active_adapters and len(self._active_adapters) >= self.lora_slots:
            self._active_adapters.remove_oldest()
        result = super().activate_adapter(lora_id)
        self._active_adapters.touch(lora_id)
        return result

    def remove_oldest_adapter(self) -> bool:
        if len(self._registered_adapters) > 0:
            self._registered_adapters.remove_oldest()
            return True
        return False


def create_lora_manager(model: nn.Module, max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int,
                        lora_config, device, lora_manager_cls: type = LoRAModelManager, **kwargs) -> LoRAModelManager:
    """Create a LoRA adapter for a given model."""
    return lora_manager_cls(model=model, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            vocab_size=vocab_size, lora_config=lora_config, device=device, **kwargs)
