"""Mirrors vllm/lora/worker_manager.py (0.10.2): ``WorkerLoRAManager`` (``_load_adapter``
builds a ``LoRAModel`` from ``lora_request.lora_path`` -- the method ms-swift's
``patch_vllm_load_adapter`` replaces to load ``TensorLoRARequest.lora_tensors`` instead)
and ``LRUCacheWorkerLoRAManager`` (``add_adapter``: an id not yet registered is loaded,
the oldest adapter evicted when the cache is full, then activated; a registered id is
only touched and activated). ``set_active_adapters`` is what the model runner calls
before a forward pass: every requested adapter is added (loading it if it is not
registered) and the mapping set. The adapter_commons helpers are inlined.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from vllm.lora.models import LoRAModel, LoRAModelManager, LRUCacheLoRAModelManager, create_lora_manager
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.request import LoRARequest
from vllm.lora.utils import get_adapter_absolute_path


class WorkerLoRAManager:
    """WorkerLoRAManager that manages LoRA models on the worker side."""

    _manager_cls: type = LoRAModelManager

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, vocab_size: int, lora_config,
                 device: torch.device, embedding_modules: dict, embedding_padding_modules: list,
                 lora_model_cls: type = LoRAModel, max_position_embeddings: Optional[int] = None):
        self._lora_model_cls = lora_model_cls
        self.embedding_modules = embedding_modules
        self.embedding_padding_modules = embedding_padding_modules
        self._cached_dummy_lora = False
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.vocab_size = vocab_size
        self.lora_config = lora_config
        self.max_position_embeddings = max_position_embeddings
        self.device = device
        self._adapter_manager: LoRAModelManager

    @property
    def is_enabled(self) -> bool:
        return True

    def create_lora_manager(self, model: torch.nn.Module) -> Any:
        lora_manager = create_lora_manager(model, max_num_seqs=self.max_num_seqs,
                                           max_num_batched_tokens=self.max_num_batched_tokens,
                                           vocab_size=self.vocab_size, lora_config=self.lora_config,
                                           device=self.device, lora_manager_cls=self._manager_cls)
        self._adapter_manager = lora_manager
        return lora_manager.model

    def _load_adapter(self, lora_request: LoRARequest) -> LoRAModel:
        try:
            supported_lora_modules = self._adapter_manager.supported_lora_modules
            packed_modules_mapping = self._adapter_manager.packed_modules_mapping
            expected_lora_modules: list = []
            for module in supported_lora_modules:
                if module in packed_modules_mapping:
                    expected_lora_modules.extend(packed_modules_mapping[module])
                else:
                    expected_lora_modules.append(module)
            expected_lora_modules = list(set(expected_lora_modules))
            lora_path = get_adapter_absolute_path(lora_request.lora_path)
            peft_helper = PEFTHelper.from_local_dir(lora_path, self.max_position_embeddings,
                                                    lora_request.tensorizer_config_dict)
            peft_helper.validate_legal(self.lora_config)
            model = self._adapter_manager.model
            hf_to_vllm_mapper = getattr(model, "hf_to_vllm_mapper", None)
            lora = self._lora_model_cls.from_local_checkpoint(
                lora_path, expected_lora_modules, peft_helper=peft_helper, lora_model_id=lora_request.lora_int_id,
                device="cpu", dtype=self.lora_config.lora_dtype,
                target_embedding_padding=self.vocab_size + self.lora_config.lora_extra_vocab_size,
                embedding_modules=self.embedding_modules, embedding_padding_modules=self.embedding_padding_modules,
                tensorizer_config_dict=lora_request.tensorizer_config_dict, weights_mapper=hf_to_vllm_mapper)
        except FileNotFoundError as e:
            raise ValueError(f"Loading lora {lora_request.lora_name} failed: No adapter "
                             f"found for {lora_request.lora_path}") from e
        if lora.extra_vocab_size > self.lora_config.lora_extra_vocab_size:
            raise ValueError(f"LoRA added vocab size {lora.extra_vocab_size} is greater than "
                             f"lora_extra_vocab_size {self.lora_config.lora_extra_vocab_size}.")
        return lora

    def set_active_adapters(self, requests: set, mapping: Optional[Any]) -> None:
        self._apply_adapters(requests)
        self._adapter_manager.set_adapter_mapping(mapping)

    def _apply_adapters(self, adapter_requests: set) -> None:
        models_that_exist = self.list_adapters()
        models_map = {r.adapter_id: r for r in adapter_requests if r}
        if len(models_map) > self._adapter_manager.adapter_slots:
            raise RuntimeError(f"Number of requested models ({len(models_map)}) is greater than the number of "
                               f"GPU model slots ({self._adapter_manager.adapter_slots}).")
        new_models = set(models_map)
        for adapter_id in models_that_exist - new_models:
            self.remove_adapter(adapter_id)
        for adapter_id in new_models - models_that_exist:
            self.add_adapter(models_map[adapter_id])

    def add_adapter(self, adapter_request: Any) -> bool:
        if adapter_request.adapter_id in self.list_adapters():
            return False
        loaded_adapter = self._load_adapter(adapter_request)
        loaded = self._adapter_manager.add_adapter(loaded_adapter)
        self._adapter_manager.activate_adapter(loaded_adapter.id)
        return loaded

    def remove_adapter(self, adapter_id: int) -> bool:
        return self._adapter_manager.remove_adapter(adapter_id)

    def remove_all_adapters(self) -> None:
        self._adapter_manager.remove_all_adapters()

    def list_adapters(self) -> set:
        return set(self._adapter_manager.list_adapters())


class LRUCacheWorkerLoRAManager(WorkerLoRAManager):
    """Uses an LRU Cache: every request, the requested LoRAs are loaded (unless they are already
    loaded) and least recently used LoRAs unloaded if the cache is above capacity."""

    _manager_cls: type = LRUCacheLoRAModelManager

    def _apply_adapters(self, lora_requests: set) -> None:
        loras_map = {r.lora_int_id: r for r in lora_requests if r}
        if len(loras_map) > self._adapter_manager.lora_slots:
            raise RuntimeError(f"Number of requested LoRAs ({len(loras_map)}) is greater than the number of GPU "
                               f"LoRA slots ({self._adapter_manager.lora_slots}).")
        for lora in loras_map.values():
            self.add_adapter(lora)

    def add_adapter(self, lora_request: LoRARequest) -> bool:
        # load_inplace (0.15+): reload an id already registered (the registered one removed first)
        if lora_request.lora_int_id not in self.list_adapters() or getattr(lora_request, "load_inplace", False):
            lora = self._load_adapter(lora_request)
            self._adapter_manager.remove_adapter(lora.id)
            if len(self._adapter_manager) + 1 > self._adapter_manager.capacity:
                self._adapter_manager.remove_oldest_adapter()
            loaded = self._adapter_manager.add_adapter(lora)
        else:
            loaded = self._adapter_manager.get_adapter(lora_request.lora_int_id) is not None
        self._adapter_manager.activate_adapter(lora_request.lora_int_id)
        return loaded
