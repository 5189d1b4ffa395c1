"""Keep the MoE expert Parameters across vllm-ascend's ``NPUWorker.wake_up``.

vllm-ascend 0.12.0rc1 - 0.25.1rc1 (``NPUWorker.wake_up``; read in the 0.12.0rc1, 0.13.0, 0.18.0,
0.23.0, 0.24.0rc1 and 0.25.1rc1 wheels) finish every wake that includes ``weights`` of an unquantized
model by re-laying the fused MoE expert weights: each ``w2_weight`` whose dim 2 is the hidden size and
each ``w13_weight`` whose dim 1 is becomes a NEW ``nn.Parameter`` holding ``param.transpose(1, 2)``.
But the allocator has just restored the bytes of the weights as they were before the sleep, in the
layout ``AscendUnquantizedFusedMoEMethod.process_weights_after_loading`` made for
``npu_grouped_matmul`` ([E, H, 2I] / [E, I, H]); the transpose takes them out of it. The next forward
fails with a shape mismatch (vllm-ascend#11548, #12226), and whatever the trainer attached to the old
Parameter objects (a ``weight_loader``, as ms-swift and verl attach for their pushes) is gone with them.
vllm-ascend PR #13012 (0.26.0rc1) removes the re-layout; ms-swift 4.5+ carries the same repair as this
module for its own runs (``swift/model/npu_patch/vllm_ascend_moe.py``).

:func:`keep_layout` wraps the worker's ``wake_up``: it notes the expert Parameters before the call and,
after it (also when it raises), puts back every one the call replaced by a re-laid view of the same
storage -- the objects, hence their layout and attributes, are the ones slept with. A Parameter
replaced by a tensor of other storage is left as the call made it.
"""
from __future__ import annotations

from shim.engine import call_args, log, probes

NAMES = ("w13_weight", "w2_weight")


def _expert_parameters(model) -> list:
    """``(module, name, Parameter)`` of every fused expert weight of ``model``."""
    found = []
    for module in model.modules():
        own = getattr(module, "_parameters", None) or {}
        for name in NAMES:
            param = own.get(name)
            if param is not None:
                found.append((module, name, param))
    return found


def _same_storage(a, b) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except Exception:
        return False


def keep_layout(wrapped, instance, args, kwargs):
    tags = call_args.arg(wrapped, args, kwargs, "tags")
    model = getattr(getattr(instance, "model_runner", None), "model", None)
    if model is None or (tags is not None and "weights" not in tags):
        return wrapped(*args, **kwargs)
    kept = _expert_parameters(model)
    if not kept:
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:
        restored = 0
        for module, name, param in kept:
            now = module._parameters.get(name)
            if now is not param and now is not None and _same_storage(now, param):
                setattr(module, name, param)  # nn.Module registers it again under its name
                restored += 1
        if restored:
            message = (f"vllm-ascend wake_up re-laid {restored} MoE expert weights (vllm-ascend#11548): "
                       f"the Parameters slept with are back, in their processed layout")
            if log.once(("moe-layout", "re-laid")):
                log.decision(message)
            else:
                log.event(message, important=False)


def probe_relayout(cls) -> "str | None":
    """None where ``cls.wake_up`` re-lays the MoE weights (the tokens of the 0.12-0.25 code); else why not."""
    wake = vars(cls).get("wake_up")  # the class's own (vllm-ascend's NPUWorker)
    if wake is None:
        return probes.changed(f"{cls.__name__} defines no wake_up")
    source, reason = probes.source(wake, f"{cls.__name__}.wake_up")
    if source is None:
        return reason
    hits = [t for t in ("w13_weight", "w2_weight", "transpose(1, 2)", "setattr(") if t in source]
    if not hits:
        return "fixed upstream (wake_up no longer re-lays the MoE expert weights)"
    if len(hits) < 4:
        return probes.changed(f"{cls.__name__}.wake_up has {', '.join(hits)} only")
    return None
