"""Mirrors vllm/model_executor/model_loader/reload/layerwise.py (0.24) as far as the outcome goes.

vLLM, per layer (module): ``initialize_layerwise_reload`` keeps the layer's current parameters
and buffers (``kernel_tensors``, the storage CUDA graphs point at), puts the layer back to its
checkpoint format on the meta device and wraps each parameter's weight loader so that loads are
buffered until the layer has all its elements (``load_numel_total``); then ``_layerwise_process``
materialises the layer with ``torch.empty``, replays the loads, runs the layer's quant method's
``process_weights_after_loading`` and copies the result into the kernel tensors.
``finalize_layerwise_reload`` handles what is left: a layer none of whose elements were loaded
gets its kernel tensors back (``logger.warning("%s: Failed to load weights")``); a layer loaded in
part is processed as it is -- the elements not loaded keep what ``torch.empty`` gave them (this is
why one reload per weight CHUNK corrupts layers split across chunks, SkyRL#1680 / #1737); attention
layers (``Attention``, ``MLAAttention``) are processed last with their own
``process_weights_after_loading(model_config.dtype)``, which re-derives MLA's ``W_UK_T`` / ``W_UV``.

The fake writes loads straight into the parameters (``GPUModelRunner._write_weights`` calls
:func:`note_loaded`) instead of buffering them on meta, and models the outcome: per-layer element
counting, online processing of a complete layer, garbage for the unloaded elements of a layer
finished in part, the attention layers re-processed at ``finalize`` (the KV-cache scales of a quantized
attention layer a load wrote re-derived first). The meta device and torchao are not modelled.
"""
from __future__ import annotations

import weakref

import torch

from vllm.logger import init_logger
from vllm.model_executor.layers.attention import Attention, MLAAttention

logger = init_logger(__name__)


class LayerReloadingInfo:
    def __init__(self):
        self.reset()

    def reset(self):
        self.load_numel = 0
        self.load_numel_total = None
        self.loaded: set[str] = set()
        self.kernel_tensors = None

    def can_load(self) -> bool:
        return self.load_numel_total is not None


LAYERWISE_INFO: "weakref.WeakKeyDictionary[torch.nn.Module, LayerReloadingInfo]" = weakref.WeakKeyDictionary()


def get_layerwise_info(layer) -> LayerReloadingInfo:
    if layer not in LAYERWISE_INFO:
        LAYERWISE_INFO[layer] = LayerReloadingInfo()
    return LAYERWISE_INFO[layer]


def _own_tensors(layer) -> dict:
    out = {n: p for n, p in layer._parameters.items() if p is not None}
    out.update({n: b for n, b in layer._buffers.items() if b is not None})
    return out


@torch.no_grad()
def initialize_layerwise_reload(model) -> None:
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if info.can_load():  # Skip if the layer has already been initialized
            continue
        info.kernel_tensors = _own_tensors(layer)
        info.load_numel = 0
        info.load_numel_total = sum(t.numel() for t in info.kernel_tensors.values())


def note_loaded(model, name: str, param) -> None:
    """The fake's stand-in for ``online_process_loader``: ``name`` of ``model`` was just loaded."""
    owner_name, _, pname = name.rpartition(".")
    try:
        layer = model.get_submodule(owner_name) if owner_name else model
    except AttributeError:
        return
    info = LAYERWISE_INFO.get(layer)
    if info is None or not info.can_load():
        return
    info.loaded.add(pname)
    info.load_numel += param.numel()
    if isinstance(layer, (Attention, MLAAttention)):  # attention waits for finalize
        return
    if info.load_numel >= info.load_numel_total:
        _layerwise_process(layer, info)


def _layerwise_process(layer, info: LayerReloadingInfo) -> None:
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is not None:
        quant_method.process_weights_after_loading(layer)
    info.reset()


@torch.no_grad()
def _empty_unloaded(layer, info: LayerReloadingInfo) -> None:
    """``materialize_layer``'s ``torch.empty`` for the elements no load wrote (then copied into the kernel)."""
    g = torch.Generator().manual_seed(0xE3 + len(info.loaded))
    for name, t in _own_tensors(layer).items():
        if name not in info.loaded and t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * 3.0)


def finalize_layerwise_reload(model, model_config) -> None:
    deferred = []
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if not info.can_load():
            info.reset()
            continue
        if isinstance(layer, (Attention, MLAAttention)):
            deferred.append((layer, info))
            continue
        if info.load_numel <= 0:
            if info.load_numel_total > 0:
                logger.warning("%s: Failed to load weights", layer.__class__.__name__)
        elif info.load_numel < info.load_numel_total:
            logger.debug("%s: Delayed processing", layer.__class__.__name__)
            _empty_unloaded(layer, info)
            _layerwise_process(layer, info)
        info.reset()
    from vllm.model_executor.layers.attention.mla_attention import post_load

    for layer, info in deferred:  # (kernel tensors placed back)
        if info.load_numel > 0:
            _reload_attention_scales(layer, info)
        post_load(layer, model_config)  # 0.34: finalize_model_weights, hook() without a dtype
        info.reset()


@torch.no_grad()
def _reload_attention_scales(layer, info: LayerReloadingInfo) -> None:
    """``_reload_attention_scales`` (0.24, 0.34): the quant method re-creates the scale parameters at the
    sentinel -1.0, the buffered loads are replayed, the scales derived again. The fake's loads are already
    in the parameters: the scales no load wrote are put at the sentinel, then the quant method runs."""
    quant_method = getattr(layer, "quant_method", None)
    if quant_method is None:
        return
    for name in getattr(quant_method, "SCALES", ()):
        if name not in info.loaded and hasattr(layer, name):
            getattr(layer, name).fill_(-1.0)
    quant_method.process_weights_after_loading(layer)
