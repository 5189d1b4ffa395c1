"""First-sleep reset: a first sleep that freed nothing, re-checked after the warm-up.

When the first sleep after construction was ineffective (``SleepState.measure.reset`` =
``"pending"``, set by the engine's ``SleepState``), the sleep after the warm-up (the
first wake + generate cycle; the trainer issues it) is re-checked on the device.
Effective: logged as recovered. Ineffective again: the shim re-issues it once
there (``SleepState`` wakes every tag with the allocator guard on, gc +
``empty_cache``, sleeps, measures), which frees what was still referenced or
cached at the first sleep. Still ineffective: the memory was allocated outside
the pool and no run-time action gives it back (on the device the pages belong to
PyTorch's caching allocator, not to vLLM's pool); one WARNING says so, with the
number of GiB (:func:`unrecoverable`); ``SHIM_STRICT=1`` raises.
"""
from __future__ import annotations

from shim.observe.events import gib


def recovered(name, tracked, freed, reissued) -> str:
    """The INFO line of a reset whose sleep after the warm-up (``reissued``: the re-issued one) was effective."""
    how = "the re-issued sleep" if reissued else "the sleep"
    return (f"first-sleep reset {name}: after the warm-up {how} freed {gib(freed)} GiB of {gib(tracked)} GiB "
            f"tracked; the first sleep's gap is closed")


def unrecoverable(name, tracked, freed, cause, engine_bytes) -> str:
    """The WARNING of a reset whose re-issued sleep is still ineffective (``engine_bytes``: what the
    construction took, None where not measured)."""
    outside = None if engine_bytes is None else max(engine_bytes - tracked, 0)
    amount = "this engine's memory" if outside is None else f"{gib(outside)} GiB of this engine's memory"
    return (f"first-sleep reset {name}: the sleep after the warm-up, re-issued, is still ineffective (the device got "
            f"back {gib(freed)} GiB, the pool tracked {gib(tracked)} GiB): {amount} was allocated outside "
            f"the sleep pool ({cause}) and cannot be released at run time; every sleep of this engine will "
            f"free ~{gib(freed)} GiB. Rebuild the engine with expandable segments off at "
            f"construction (keep the shim's vllm-sleep-guard on, or set expandable_segments:False in the "
            f"allocator env vars)")
