"""A PEFT LoRA model's merged weights for one weight push, computed out of place: the base is never written.

Trainers push a PEFT model's weights to vLLM as ``model.merge_adapter()``, read the base tensors,
``model.unmerge_adapter()``. PEFT's ``merge`` adds each adapter's delta into the base weight in
place and ``unmerge`` subtracts it again (every PEFT release up to 0.21.2: ``LoraLayer.unmerge``
does ``weight.data -= delta``); in bfloat16 ``(W + dW) - dW != W``, so each push moves the frozen
base by a rounding in many elements, and the walk compounds over pushes. :class:`Push` stands in for
both during one push and gives the engine merged copies; :func:`plan` decides per push, and
:func:`verified_tensors` gives weight verification what such a push hands the engine.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

from shim.engine import log
from shim.engine.shadow import shadow
from shim.observe import events

_LORA_CLASSES = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d")


def _lora_classes() -> tuple:
    from peft.tuners.lora import layer

    return tuple(c for c in (getattr(layer, n, None) for n in _LORA_CLASSES) if isinstance(c, type))


def _offloaded(layer) -> bool:
    """A module of ``layer`` offloaded by accelerate (PEFT's ``onload_layer`` would move it in and out)."""
    return any(getattr(getattr(m, "_hf_hook", None), "offload", False) for m in layer.modules())


def _why_not(model, layers) -> "str | None":
    if any(n in vars(model) for n in ("merge_adapter", "unmerge_adapter")):
        return "merge_adapter/unmerge_adapter replaced on the model by someone else"
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


def stand_down(patch_id: str, reason: str) -> None:
    """One WARNING per patch and reason: this push merges in place, as upstream does."""
    if log.once(("peft-merge", patch_id, reason)):
        log.warning(f"{patch_id}: {reason}: this push merges the LoRA adapter in place as upstream does "
                    f"(the frozen base moves by a rounding at every push)")


def plan(patch_id: str, model, why_not: "str | None" = None, whole: bool = True) -> "Push | None":
    """The out-of-place push for ``model``, or None (upstream runs as it is). ``why_not``: the
    trainer's own reason to leave this push to upstream (e.g. FSDP), for a PEFT model only.
    ``whole``: each merge is followed by a push of every base tensor (checked at the unmerge).

    None for a model that is not a ``peft.PeftModel`` (and never imports peft itself), or where the
    out-of-place path could not be exact -- a tuner layer other than LoRA's ``Linear``, ``Embedding``,
    ``Conv1d/2d/3d`` (quantized layers, ``target_parameters``, other tuners), a LoRA variant (DoRA, aLoRA,
    ...), a layer already merged, a layer offloaded by accelerate, or ``merge_adapter`` already replaced on
    the model -- then upstream's in-place merge runs, and one WARNING per reason and patch says so.
    """
    if "peft" not in sys.modules:
        return None
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    if not isinstance(model, PeftModel):
        return None
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    reason = why_not or _why_not(model, layers)
    if reason:
        stand_down(patch_id, reason)
        return None
    return Push(patch_id, model, layers, whole)


def _merged_leaves(layer, adapters) -> tuple:
    """The base tensors of ``layer`` that PEFT's merge of ``adapters`` writes: its weight, and its bias where
    one of them has a LoRA bias (``lora_bias=True``)."""
    base = layer.get_base_layer()
    lora_bias = getattr(layer, "lora_bias", {})
    return ("weight",) + (("bias",) if getattr(base, "bias", None) is not None
                          and any(lora_bias.get(a) for a in adapters) else ())


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


class Push:
    """Stands in for ``merge_adapter``/``unmerge_adapter`` of one PEFT model during one push.

    :meth:`standing_in`: instance attributes on the model, taken out however the push ends. Its
    merge writes nothing: it notes the base tensors upstream's merge would change, by storage address
    (the ``param.data`` the trainer reads next, gathered where DeepSpeed ZeRO-3 gathers). The trainer's
    binding passes each tensor it is about to push through :meth:`tensor`: a noted one comes back as
    a merged copy, PEFT's own ``merge`` of its layer applied to copies of that layer's base tensors (the
    layer's base ``Parameter`` points at the copies only during that call), so the engine receives the
    bytes upstream's in-place merge gives it; one layer's copies are made at a time, when asked for.
    """

    def __init__(self, patch_id: str, model, layers, whole: bool = True):
        self.patch_id, self.model, self.layers, self.whole = patch_id, model, layers, whole
        self.noted: dict = {}   # data_ptr of a base tensor upstream's merge would change -> (layer, name, names)
        self.copies: dict = {}  # (layer, name) -> merged copy made along with another tensor of its layer
        self.pushed: set = set()
        self.merge_kwargs: dict = {}

    def merge_adapter(self, adapter_names=None, safe_merge: bool = False) -> None:
        from peft.tuners.tuners_utils import check_adapters_to_merge

        check = getattr(self.model.base_model, "_check_merge_allowed", None)
        if check is not None:
            check()  # upstream's merge_adapter refuses (or warns about) the same configurations
        self.merge_kwargs = {"safe_merge": safe_merge, "adapter_names": adapter_names}
        self.noted, self.copies, self.pushed = {}, {}, set()
        for layer in self.layers:
            adapters = check_adapters_to_merge(layer, adapter_names)
            if not adapters:
                continue
            base = layer.get_base_layer()
            names = _merged_leaves(layer, adapters)
            for name in names:
                self.noted[getattr(base, name).data_ptr()] = (layer, name, names)

    def unmerge_adapter(self) -> None:
        missed = len({(layer, name) for layer, name, _ in self.noted.values()} - self.pushed)
        if self.whole and missed:
            log.warning(f"{self.patch_id}: {missed} LoRA base tensor(s) were not asked for between merge and "
                        f"unmerge: the engine may hold them without the adapter (upstream shape changed?)")
        if self.pushed:
            events.count("lora_pushes_out_of_place")
        self.noted, self.copies, self.pushed = {}, {}, set()

    def tensor(self, tensor):
        """What to push in place of ``tensor`` (a base tensor's ``param.data`` as the trainer reads it)."""
        key = self.noted.get(tensor.data_ptr()) if self.noted else None
        if key is None:
            return tensor
        layer, name, names = key
        merged = self.copies.pop((layer, name), None)
        if merged is None:
            made = _merged_tensors(layer, names, self.merge_kwargs)
            self.copies.update({(layer, n): t for n, t in made.items() if n != name})
            merged = made[name]
        if merged.shape != tensor.shape:  # not the tensor noted: push what the trainer read
            log.warning(f"{self.patch_id}: a pushed tensor shares a LoRA base weight's storage but not its shape; "
                        f"pushed as read")
            return tensor
        self.pushed.add((layer, name))
        return merged

    @contextmanager
    def standing_in(self):
        with shadow(self.model, "merge_adapter", self.merge_adapter), \
                shadow(self.model, "unmerge_adapter", self.unmerge_adapter):
            yield self


# ---------------------------------------------------------------------------
# weight verification: what the push of a PEFT model gives the engine
# ---------------------------------------------------------------------------
PEFT_PREFIX = "base_model.model."
PUSH_MERGE = {"safe_merge": False, "adapter_names": None}
"""The merge every trainer push runs (``model.merge_adapter()``: the active adapters, no safe merge)."""


def pushed_name(name: str, prefix: str = "lora_", base_layer: bool = False) -> "str | None":
    """A PEFT model's parameter name as the trainer's push gives it to vLLM, or None where the push leaves it
    out (TRL 1.16 ``VLLMGeneration._iter_named_params``, the same in 0.23-1.15: ``base_model.model.`` and
    ``.base_layer`` dropped, the adapters' own tensors and ``modules_to_save``' original modules skipped,
    ``modules_to_save.default.`` dropped). ``base_layer``: ``.base_layer`` kept (a push to vLLM's own LoRA)."""
    name = name.removeprefix(PEFT_PREFIX)
    if not base_layer:
        name = name.replace(".base_layer", "")
    if prefix in name or "original_module" in name:
        return None
    return name.replace("modules_to_save.default.", "")


class Merged(dict):
    """A PEFT model's tensors by pushed name, as the push gives them to the engine (``shim.verify.compare``'s
    derived source): ``self[name]`` is the trainer tensor (shape, dtype, bytes), ``derive(name)`` for the LoRA
    base tensors in :attr:`derived` the adapter merged into a copy of it by PEFT's own ``merge`` of its layer
    (:func:`_merged_tensors`, what :class:`Push` gives the push, and what upstream's in-place merge writes), made
    at the call from the tensors as they are then."""

    def __init__(self):
        super().__init__()
        self.derived: dict = {}  # pushed name -> (layer, leaf, leaves the merge writes)

    def derive(self, name: str):
        layer, leaf, leaves = self.derived[name]
        return _merged_tensors(layer, leaves, PUSH_MERGE)[leaf]


def verified_tensors(model) -> "tuple[Merged | None, str | None]":
    """``(tensors, None)``: what a push of the PEFT model ``model`` gives the engine, by pushed name
    (:class:`Merged`); ``(None, why)`` where it cannot be reproduced exactly; ``(None, None)``: not a PEFT model
    (the caller reads the model's own parameters)."""
    if "peft" not in sys.modules:
        return None, None
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer, check_adapters_to_merge

    if not isinstance(model, PeftModel):
        return None, None
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    why = _why_not(model, layers)
    if why:
        return None, f"PEFT model with {why} (the merged weights are not reproduced out of place)"
    leaves = {}
    for layer in layers:
        adapters = check_adapters_to_merge(layer, None)
        if adapters:
            names = _merged_leaves(layer, adapters)
            base = layer.get_base_layer()
            leaves.update({id(getattr(base, leaf)): (layer, leaf, names) for leaf in names})
    from shim.verify import layout

    out = Merged()
    prefix = getattr(model, "prefix", None) or "lora_"
    for name, p in model.named_parameters():
        if hasattr(p, "ds_id") or callable(getattr(p, "full_tensor", None)):
            return None, "PEFT model sharded by ZeRO-3 or FSDP (the merge needs whole tensors)"
        pushed = pushed_name(name, prefix)
        if pushed is None:
            continue
        pushed = layout.trainer_name(pushed)
        if pushed in out:
            continue
        out[pushed] = p
        if id(p) in leaves:
            out.derived[pushed] = leaves[id(p)]
    tied = "model.embed_tokens.weight"
    if "lm_head.weight" not in out and tied in out:  # tied embeddings (as layout.trainer_params)
        out["lm_head.weight"] = out[tied]
        if tied in out.derived:
            out.derived["lm_head.weight"] = out.derived[tied]
    return out, None
