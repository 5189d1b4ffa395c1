"""An attribute of one object replaced for one block of code (ms-swift's rollout calls: one engine's
``wake_up``, one trainer's ``offload_model`` / ``load_model``), then put back exactly.

Only that object sees the replacement, and only inside the block: the class and every other instance
keep what they had (the patch-lifetime changes to classes are the ``Patcher``'s).
"""
from __future__ import annotations

from contextlib import contextmanager

_MISSING = object()


@contextmanager
def shadow(obj, name: str, value):
    """``obj.name = value`` inside the block (yields ``value``); afterwards the object's own attribute
    as it was, or none (what its class provides shows again). Stacks with others doing the same on the
    same name (the shim's reload session around a push, a LoRA stand-in inside it): if ours is no longer
    there when the block ends (someone set theirs on top, or already took ours out), it is left as it is.
    Raises what setting the attribute raises (an object without ``__dict__``, a proxy that refuses it)
    before the block runs, so a caller can keep upstream's way."""
    own = vars(obj).get(name, _MISSING)
    setattr(obj, name, value)
    try:
        yield value
    finally:
        if vars(obj).get(name, _MISSING) is value:
            if own is _MISSING:
                vars(obj).pop(name, None)
            else:
                setattr(obj, name, own)
