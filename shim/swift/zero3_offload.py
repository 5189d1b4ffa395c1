"""ZeRO-3 partitions moved off the device and back around ms-swift 3.x's ``offload_model`` /
``load_model`` (patches ``swift-zero3-offload`` and ``swift-grpo-zero3-offload``; the why, and
where this differs from ms-swift 4.0.0's fix, is in ``patches/swift_zero3_offload.py``).

The moves are an extra action of the shim after ms-swift's own loop: an exception in them is one
WARNING and training goes on as ms-swift left it (``SHIM_STRICT=1`` raises); the partitions moved
before it stay marked, so the next ``load_model`` still brings them back.
"""
from __future__ import annotations

from shim.engine import call_args, config, log


def _partitioned(model):
    """The ZeRO-3 parameters of ``model`` (DeepSpeed gives each a ``ds_tensor`` partition), or []."""
    parameters = getattr(model, "parameters", None)
    if parameters is None:
        return []
    return [p for p in parameters() if getattr(p, "ds_tensor", None) is not None]


def _empty_cache():
    import torch

    torch.cuda.empty_cache()  # a no-op where CUDA is not initialised
    npu = getattr(torch, "npu", None)  # torch_npu
    if npu is not None and hasattr(npu, "empty_cache"):
        npu.empty_cache()


def _owns_storage(t) -> bool:
    """False for a view into a larger buffer (DeepSpeed's ZeRO-3 optimizer flattens the partitions)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _offload(model) -> int:
    """Each partition of ``model`` that owns its device storage to the CPU; how many moved."""
    import torch

    moved = 0
    with torch.no_grad():
        for param in _partitioned(model):
            part = param.ds_tensor
            if not _owns_storage(part):  # the optimizer's flat buffer keeps the memory: a copy frees nothing
                continue
            host = part.data.to("cpu", non_blocking=True)
            if host.untyped_storage().data_ptr() == part.untyped_storage().data_ptr():
                continue  # already on the host (ZeRO-3 offload_param): DeepSpeed's placement, left alone
            part.data = host
            part._shim_offloaded = True  # on the partition object: load moves exactly these back
            moved += 1
    if moved:
        _empty_cache()
    return moved


def _load(model, device) -> None:
    """The partitions :func:`_offload` moved, back to ``device``."""
    import torch

    with torch.no_grad():
        for param in _partitioned(model):
            part = param.ds_tensor
            if getattr(part, "_shim_offloaded", False):
                part.data = part.data.to(device, non_blocking=True)
                part._shim_offloaded = False


def _extra(what: str, action) -> None:
    """The shim's extra action after ms-swift's own call: never the reason training stops."""
    try:
        action()
    except Exception as exc:
        if config.strict():
            raise
        log.warning(f"swift-zero3-offload: {what} of the ZeRO-3 partitions failed ({type(exc).__name__}: {exc}); "
                    f"they stay where ms-swift's own {what} left them")


def wrappers(current_device):
    """``(offload_model, load_model)`` wrapt wrappers; ``current_device()`` is the device ms-swift's
    own ``load_model`` moves ``param.data`` to (its module's ``get_current_device``). FSDP2 models
    (3.12.x ``_is_fsdp2``) are ms-swift's own."""

    def offload_model(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        if not getattr(instance, "_is_fsdp2", False):
            _extra("offload", lambda: _offload(call_args.arg(wrapped, args, kwargs, "model")))
        return result

    def load_model(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        if not getattr(instance, "_is_fsdp2", False):
            _extra("load", lambda: _load(call_args.arg(wrapped, args, kwargs, "model"), current_device()))
        return result

    return offload_model, load_model
