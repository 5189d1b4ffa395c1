"""ms-swift's ``offload_context`` reloads only the models its own offload moved (patches
``swift-gkd-offload-reload`` and ``swift-grpo-offload-reload``; the why is in
``patches/swift_offload_reload.py``).

What moved is read from what happened (4.0-4.5's ``offload_model`` returns nothing), as ms-swift 4.6.0's
``GRPOTrainer.offload_context`` reads it from the return value ("Only reload models that this context
actually moved off the GPU"). A model whose tensors cannot be read counts as moved, and a trainer whose
methods cannot be shadowed keeps ms-swift's own reload: never a model left on the CPU that left the device.
"""
from __future__ import annotations

from contextlib import ExitStack

from shim.engine import call_args, log
from shim.engine.shadow import shadow


def _where(tensor):
    try:
        storage = tensor.untyped_storage().data_ptr()
    except Exception:  # a tensor subclass without a storage of its own (FSDP2's DTensor): its device tells
        storage = None
    return str(tensor.device), storage


def placement(model) -> list:
    """Where each tensor of ``model`` lives: ``(device, storage address)`` per parameter, ZeRO-3 partition
    and buffer, in module order."""
    out = []
    for param in model.parameters():
        out.append(_where(param))
        partition = getattr(param, "ds_tensor", None)
        if partition is not None:
            out.append(_where(partition))
    out.extend(_where(buf) for buf in model.buffers() if buf is not None)
    return out


class ReloadOnlyMoved:
    """The release's ``offload_context()`` (a ``contextlib`` context manager) with the ``offload_model`` /
    ``load_model`` calls it makes itself watched: entered and exited as the original is.

    One ``offload_context`` at a time: while it is entered, each ``self.offload_model(model)`` it calls is
    watched, and the model counts as moved where one of its tensors (each parameter, a ZeRO-3
    parameter's partition ``ds_tensor`` too, each buffer) is no longer where it was: another device, or
    another storage (``offload_model`` replaces ``param.data`` with a CPU copy of a tensor on the
    device; a tensor already on the CPU it leaves as it is). While the context exits,
    ``self.load_model(model)`` runs for the models counted moved and does nothing for the others. The
    optimizer is left to ms-swift.
    """

    def __init__(self, context, trainer, name: str):
        self._context, self._trainer, self._name = context, trainer, name
        self._moved: "dict | None" = None  # id(model) -> model; None: not watched, ms-swift reloads as it does

    def _shadowed(self, method: str, replacement, step):
        with ExitStack() as stack:
            try:
                stack.enter_context(shadow(self._trainer, method, replacement))
            except Exception as exc:  # a trainer that takes no attribute: ms-swift's own calls
                log.debug(f"{self._name}: {method} not watched ({type(exc).__name__}: {exc})")
                return step(), False
            return step(), True

    def __enter__(self):
        offload, moved = self._trainer.offload_model, {}  # bound: the class's method with every wrapper on it

        def offload_model(*args, **kwargs):
            model = call_args.arg(offload, args, kwargs, "model")
            try:
                before = placement(model)
            except Exception:
                before = None
            result = offload(*args, **kwargs)
            try:
                stayed = before is not None and placement(model) == before
            except Exception:
                stayed = False
            if not stayed:
                moved[id(model)] = model
            return result

        result, watched = self._shadowed("offload_model", offload_model, self._context.__enter__)
        self._moved = moved if watched else None
        return result

    def __exit__(self, *exc_info):
        if self._moved is None:
            return self._context.__exit__(*exc_info)
        load, moved, kept = self._trainer.load_model, self._moved, []

        def load_model(*args, **kwargs):
            model = call_args.arg(load, args, kwargs, "model")
            if id(model) in moved:
                return load(*args, **kwargs)
            kept.append(type(model).__name__)  # nothing of it left the device: it stays where it is
            return None

        result, _ = self._shadowed("load_model", load_model, lambda: self._context.__exit__(*exc_info))
        if kept:
            log.event(f"{self._name}: offload_context moved nothing of {', '.join(kept)} off the device: not loaded "
                      "onto it (as ms-swift 4.6.0's GRPOTrainer)", important=log.once((self._name, "left in place")))
        return result


def wrapper(name: str):
    """The wrapt wrapper of an ``offload_context`` method; ``name``: the patch id, for its log lines (the
    first model left in place is an INFO line, later ones DEBUG)."""
    def offload_context(wrapped, instance, args, kwargs):
        return ReloadOnlyMoved(wrapped(*args, **kwargs), instance, name)

    return offload_context
