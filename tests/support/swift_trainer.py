"""A ms-swift trainer built without its ``__init__`` for the scenarios in ``tests/scenarios`` (imports
nothing of the shim: a scenario decides itself whether the shim is on)."""
from __future__ import annotations


def bare_trainer(base, args, model, template, tok):
    """An instance of a fresh subclass of ``base`` (the rollout mixin or a ``GRPOTrainer``) with the
    attributes every rollout path reads: arguments, model, template, processor, a CPU accelerator,
    ``state.global_step`` 0, no multimodal / multi-turn, no FSDP2. Patching its class
    (``type(t)``) leaves ``base`` untouched."""
    from accelerate import Accelerator

    class Trainer(base):
        pass

    t = Trainer.__new__(Trainer)
    t.args, t.model, t.template, t.processing_class = args, model, template, tok
    t.accelerator = Accelerator(cpu=True)
    t.state = type("State", (), {"global_step": 0})()
    t.is_multimodal = False
    t.multi_turn_scheduler = None
    t._is_fsdp2 = False  # 4.x: set by the trainer when it prepares FSDP2
    return t
