"""First-sleep reset: a first sleep that freed nothing, re-checked after the warm-up.

When the first sleep after construction was ineffective (``SleepState.measure.reset`` =
``"pending"``, set by ``shim.vllm.sleep.sleep_check``), the sleep after the warm-up (the
first wake + generate cycle; the trainer issues it) is re-checked on the device.
Effective: logged as recovered. Ineffective again: the shim re-issues it once
there (:func:`reissue`: wake every tag with the allocator guard on, gc +
``empty_cache``, sleep, measure), which frees what was still referenced or
cached at the first sleep. Still ineffective: the memory was allocated outside
the pool and no run-time action gives it back (on the device the pages belong to
PyTorch's caching allocator, not to vLLM's pool); one WARNING says so, with the
number of GiB (:func:`outcome`); ``SHIM_STRICT=1`` raises.
"""
from __future__ import annotations

from shim.engine import config, log
from shim.observe import events
from shim.vllm.sleep import memory, sleep_state, sleep_verdict


def reissue(engine, state, name, level, probe, sleep_again) -> tuple:
    """The reset's second attempt, once per engine: wake every tag (through the allocator
    guard's wrapper when it is on; the sleep check passes through), give the cached blocks
    back, then ``sleep_again()`` (vLLM's sleep between two device readings, returning
    ``(result, t0, t1, Measured)``). Returns ``(effective, tracked, freed, cause)``."""
    engine.wake_up()
    sleep_state.note_wake(engine, None)
    memory.release_cached(probe)
    _, t0, t1, m = sleep_again()
    effective, cause, _ = sleep_verdict.judge(state, m.tracked, m.freed)
    events.emit("sleep", name, t1 - t0, level=level, tracked=m.tracked, freed=m.freed, effective=effective,
                   asleep=sorted(state.asleep), free=m.free, total=m.total, measured=m.how,
                   note="first-sleep reset: re-issued")
    return effective, m.tracked, m.freed, cause


def outcome(state, name, effective, tracked, freed, cause, reissued=False) -> None:
    """Log the reset's result and record it in ``state.measure.reset``; strict mode raises when unrecoverable."""
    if effective:
        state.measure.reset = "recovered"
        how = "the re-issued sleep" if reissued else "the sleep"
        log.info(f"first-sleep reset {name}: after the warm-up {how} freed {events.gib(freed)} GiB of "
                 f"{events.gib(tracked)} GiB tracked; the first sleep's gap is closed")
        return
    state.measure.reset = "unrecoverable"
    outside = None if state.measure.engine_bytes is None else max(state.measure.engine_bytes - tracked, 0)
    amount = "this engine's memory" if outside is None else f"{events.gib(outside)} GiB of this engine's memory"
    message = (f"first-sleep reset {name}: the sleep after the warm-up, re-issued, is still ineffective (the device got back "
               f"{events.gib(freed)} GiB, the pool tracked {events.gib(tracked)} GiB): {amount} was allocated outside "
               f"the sleep pool ({cause}) and cannot be released at run time; every sleep of this engine will "
               f"free ~{events.gib(freed)} GiB. Rebuild the engine with expandable segments off at "
               f"construction (keep the shim's vllm-sleep-guard on, or set expandable_segments:False in the "
               f"allocator env vars)")
    log.warning(message)
    if config.strict():
        raise RuntimeError(f"[shim] {message} ({config.SHIM_STRICT}=1)")
