"""TRL's weight push of a PEFT LoRA model with the adapter merged out of place: the frozen base is never written.

TRL 1.11-1.16 ``VLLMGeneration._iter_named_params`` (the iterator both the colocate push and the
server-mode stream read): gather, ``model.merge_adapter()``, yield ``(name, param.data)`` for every
base tensor, ``model.unmerge_adapter()``. PEFT's ``merge`` adds each adapter's delta into the base
weight in place and ``unmerge`` subtracts it again; in bfloat16 ``(W + dW) - dW != W``, so each push
moves the frozen base by a rounding in many elements, and the walk compounds over pushes (the
trainer's forward and every later push read the moved base).

:func:`iter_named_params` wraps that iterator for one call. While it runs, the PEFT model's
``merge_adapter``/``unmerge_adapter`` are stood in for (instance attributes on the model, taken out
when the iterator ends, however it ends): the stand-in merge writes nothing and notes which base
tensors upstream's merge would have changed (found again by storage address when the iterator yields
them, the ``param.data`` of a gathered parameter); each of those is replaced as it is yielded by a
merged copy: PEFT's own ``merge`` of that one layer applied to copies of its base tensors (the
layer's base ``Parameter`` points at the copies only for that call), so the engine receives the
bytes upstream's in-place merge gives it, and at most one layer's copy is alive at a time.

Upstream runs unchanged for a model that is not a ``peft.PeftModel`` (no import of peft is ever
caused here), and stands in, one WARNING per reason, where the out-of-place path could not be exact:
FSDP (TRL's FSDP walk re-gathers module by module), a tuner layer other than LoRA's ``Linear``,
``Embedding`` or ``Conv1d/2d/3d`` (quantized layers, ``target_parameters``, other tuners), a LoRA
variant (DoRA, aLoRA, ...), a layer already merged, or one offloaded by accelerate.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

from shim.engine import log
from shim.observe import events

_LORA_CLASSES = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d")
_told: set = set()  # stand-down reasons already logged (one WARNING each per process)


def _lora_classes() -> tuple:
    from peft.tuners.lora import layer

    return tuple(c for c in (getattr(layer, n, None) for n in _LORA_CLASSES) if isinstance(c, type))


def _offloaded(layer) -> bool:
    """A module of ``layer`` offloaded by accelerate (PEFT's ``onload_layer`` would move it in and out)."""
    return any(getattr(getattr(m, "_hf_hook", None), "offload", False) for m in layer.modules())


def _why_not(model, layers) -> "str | None":
    classes = _lora_classes()
    for layer in layers:
        if type(layer) not in classes:
            return f"{type(layer).__module__}.{type(layer).__name__} layers"
        if getattr(layer, "lora_variant", None):
            return f"LoRA variants ({', '.join(sorted(type(v).__name__ for v in layer.lora_variant.values()))})"
        if layer.merged:
            return "a LoRA layer already merged before the push"
        if _offloaded(layer):
            return "layers offloaded by accelerate"
    return None


def _plan(gen) -> "_Push | None":
    """The out-of-place push for ``gen``'s model, or None (upstream runs as it is)."""
    if "peft" not in sys.modules:
        return None
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = getattr(gen, "model", None)
    if not isinstance(model, PeftModel):
        return None
    reason = None
    if getattr(getattr(gen, "_dist", None), "is_fsdp", False):
        reason = "FSDP"
    elif any(n in vars(model) for n in ("merge_adapter", "unmerge_adapter")):
        reason = "merge_adapter/unmerge_adapter replaced on the model by someone else"
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    reason = reason or _why_not(model, layers)
    if reason:
        if reason not in _told:
            _told.add(reason)
            log.warning(f"trl-lora-merge-drift: {reason}: this push merges the adapter in place as upstream does "
                        f"(the frozen base moves by a rounding at every push)")
        return None
    return _Push(model, layers)


def _merged_tensors(layer, names, merge_kwargs) -> dict:
    """PEFT's ``merge`` of ``layer`` applied to copies of its base tensors ``names``: name -> merged copy.
    The base tensors and the layer's merge record are as before when this returns (or raises)."""
    base = layer.get_base_layer()
    params = [getattr(base, n) for n in names]
    originals = [p.data for p in params]
    merged_before = list(layer.merged_adapters)
    try:
        for param, original in zip(params, originals):
            param.data = original.clone()
        layer.merge(**merge_kwargs)
        return {n: p.data for n, p in zip(names, params)}
    finally:
        for param, original in zip(params, originals):
            param.data = original
        layer.merged_adapters[:] = merged_before


class _Push:
    """Stands in for ``merge_adapter``/``unmerge_adapter`` of one PEFT model during one push."""

    def __init__(self, model, layers):
        self.model, self.layers = model, layers
        self.pending: dict = {}  # data_ptr of a base tensor upstream's merge would change -> (layer, name)
        self.copies: dict = {}   # (layer, name) -> merged copy made with another tensor of its layer
        self.merge_kwargs: dict = {}
        self.merged = 0

    def merge_adapter(self, adapter_names=None, safe_merge: bool = False) -> None:
        from peft.tuners.tuners_utils import check_adapters_to_merge

        check = getattr(self.model.base_model, "_check_merge_allowed", None)
        if check is not None:
            check()  # upstream's merge_adapter refuses (or warns about) the same configurations
        self.merge_kwargs = {"safe_merge": safe_merge, "adapter_names": adapter_names}
        self.pending, self.copies = {}, {}
        for layer in self.layers:
            adapters = check_adapters_to_merge(layer, adapter_names)
            if not adapters:
                continue
            base = layer.get_base_layer()
            lora_bias = getattr(layer, "lora_bias", {})
            names = ["weight"] + (["bias"] if getattr(base, "bias", None) is not None
                                  and any(lora_bias.get(a) for a in adapters) else [])
            for name in names:
                self.pending[getattr(base, name).data_ptr()] = (layer, name, tuple(names))

    def unmerge_adapter(self) -> None:
        if self.pending:
            log.warning(f"trl-lora-merge-drift: {len(self.pending)} LoRA base tensor(s) were not pushed through the "
                        f"iterator: the engine may hold them without the adapter (upstream shape changed?)")
        if self.merged:
            events.count("lora_pushes_out_of_place")
        self.pending, self.copies, self.merged = {}, {}, 0

    def tensor(self, tensor):
        """What to push in place of ``tensor`` (a yielded ``param.data``)."""
        key = self.pending.pop(tensor.data_ptr(), None) if self.pending else None
        if key is None:
            return tensor
        layer, name, names = key
        merged = self.copies.pop((layer, name), None)
        if merged is None:
            merged = _merged_tensors(layer, names, self.merge_kwargs)
            self.copies.update({(layer, n): t for n, t in merged.items() if n != name})
            merged = merged[name]
        if merged.shape != tensor.shape:  # not the tensor we noted: push what upstream yielded
            log.warning("trl-lora-merge-drift: a yielded tensor shares a LoRA base weight's storage but not its "
                        "shape; pushed as yielded")
            return tensor
        self.merged += 1
        return merged


@contextmanager
def _standing_in(push: _Push):
    model = push.model
    model.merge_adapter, model.unmerge_adapter = push.merge_adapter, push.unmerge_adapter
    try:
        yield
    finally:
        del model.merge_adapter
        del model.unmerge_adapter


def _stream(push: _Push, pairs):
    try:
        with _standing_in(push):
            for name, tensor in pairs:
                yield name, push.tensor(tensor)
    finally:
        pairs.close()


def iter_named_params(wrapped, instance, args, kwargs):
    """Wrapper of ``VLLMGeneration._iter_named_params`` (a generator: the wrapper returns one)."""
    push = _plan(instance)
    if push is None:
        return wrapped(*args, **kwargs)
    return _stream(push, wrapped(*args, **kwargs))
