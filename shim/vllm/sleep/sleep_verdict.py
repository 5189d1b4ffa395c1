"""Whether a sleep freed what it should, and when that needs a device reading.

The verdict (:func:`judge`): a sleep at level >= 1 is ineffective when the device got back less than half of
the bytes the sleep pool tracked, or when the pool tracks about nothing (< 64 MiB) while the engine holds
memory; each verdict comes with the likely cause and the fix.

Where the freed bytes come from (:func:`reading_due`): reading the device costs ~0.2 ms a sleep on an H200,
so most sleeps are judged from the pool's own bookkeeping (``shim.vllm.sleep.sleep_pool``); the device is read
on the first sleep per level, after a suspect one and every ``SHIM_DEVICE_CHECK_EVERY``-th (default 10).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from shim.engine import config

MiB = 1 << 20
NOTHING = 64 * MiB
"""A pool tracking less than this 'tracks about nothing'."""
DRIFT = 0.01
"""The pool changed since the last device reading when it tracks more than this fraction more or less."""


@dataclass
class Measurement:
    """What the sleep check measured and decided for one engine (``SleepState.measure``): the construction
    (``built``, ``sleep_mode``, ``engine_bytes``, ``init_routes``; the allocator guard's ``guarded_init`` /
    ``guard_saw``), the last sleep (``tracked_bytes``, ``freed_bytes``: None until a sleep was measured,
    ``measured``: "device" or "pool"), the counts, the first-sleep reset (``reset``: "", "pending",
    "recovered", "unrecoverable", "failed") and the torch cap a sleep lifted (``torch_cap``)."""

    built: bool = False
    sleep_mode: Optional[bool] = None
    engine_bytes: Optional[int] = None
    init_routes: list = field(default_factory=list)
    guarded_init: bool = False
    guard_saw: list = field(default_factory=list)
    tracked_bytes: int = 0
    freed_bytes: Optional[int] = None
    measured: str = ""
    sleeps: int = 0
    wakes: int = 0
    ineffective: int = 0
    reset: str = ""
    torch_cap: Optional[int] = None
    capped_warned: bool = False


@dataclass
class ReadSchedule:
    """When the sleep check reads the device next (``SleepState.schedule``; :func:`reading_due`)."""

    levels_read: set = field(default_factory=set)
    since_reading: int = 0
    reading_tracked: int = 0
    read_next: bool = False


class Measured:
    """One sleep's figures: its ``level``, ``tracked`` (pool bytes before), ``freed`` (None: not verified),
    ``free`` / ``total`` (device after; None unless read), ``how`` ("device" | "pool"), ``t0`` / ``t1``
    (``perf_counter`` around vLLM's call)."""

    __slots__ = ("level", "tracked", "t0", "t1", "freed", "free", "total", "how")

    def __init__(self, level, tracked, t0, t1):
        self.level, self.tracked, self.t0, self.t1 = level, tracked, t0, t1
        self.freed = self.free = self.total = None
        self.how = "pool"


def check_every() -> int:
    """``SHIM_DEVICE_CHECK_EVERY``; a bad value is one WARNING and the default (``config.read``)."""
    return config.device_check_every()


def reading_due(state, level: int, tracked: int, every: int) -> "str | None":
    """Why this sleep must read the device, or None: the pool's bookkeeping will do.

    Reading the device costs
    two device-wide ``mem_get_info`` readings with a synchronize and an
    ``empty_cache`` per sleep (and two per wake): ~0.2 ms on an H200, 1.6% of a
    ~15 ms level-2 sleep/wake of a 10 GiB pool. Most sleeps are judged from the
    pool's own bookkeeping instead (``shim.vllm.sleep.sleep_pool``): vLLM's allocator releases
    every handle it tracks (``unmap_and_release``: ``cuMemUnmap`` + ``cuMemRelease``,
    which gives the physical pages back or raises), and the executor marks the
    engine asleep only after its sleep returned. So when the pool tracks what the
    engine took and the executor reports every tag asleep afterwards, the sleep gave
    back the ``tracked`` bytes: the record says ``freed = tracked``, ``measured =
    "pool"``. What that cannot see is memory the pool released but the device did
    not get back (pages still held by another mapping or process), or memory that
    never was in the pool although the pool looks full; both come from how the
    engine was built and persist from sleep to sleep, so a sample finds them.

    The rule: a sleep reads the device (``measured = "device"``, exact figures) when

    1. it is the engine's first sleep at its level (every ineffective-first-sleep
       case, ms-swift #6636 included, is caught there, exactly);
    2. the first-sleep reset is pending (its re-check after the warm-up);
    3. the previous sleep was judged ineffective, or could not be verified from the
       bookkeeping (the executor did not report every tag asleep): the device is read
       until a sleep is effective again, so every ineffective verdict carries
       device figures;
    4. the bookkeeping looks wrong: the pool tracks about nothing, or less than half
       of what the engine took at construction, or it tracks more than 1% more or
       less than at the last device reading;
    5. ``SHIM_DEVICE_CHECK_EVERY`` (default 10) sleeps of this engine have passed
       since the last device reading: a sleep that the pool says freed but the device
       did not is caught at the latest at the 10th sleep after the fault appeared.
       ``SHIM_DEVICE_CHECK_EVERY=1``: every sleep is read (the exact figures of every
       cycle, at ~0.2 ms a call).

    A wake reads the device exactly when the sleep before it did (``restored``);
    otherwise ``restored`` is the pool's bytes of the tags it woke.
    """
    if every <= 1:
        return "every sleep"
    if level not in state.schedule.levels_read:
        return "first sleep at this level"
    if state.measure.reset == "pending":
        return "first-sleep reset re-check"
    if state.schedule.read_next:
        return "the previous sleep was ineffective or unverified"
    if tracked < NOTHING:
        return "the pool tracks about nothing"
    held = state.measure.engine_bytes
    if held is not None and held >= NOTHING and tracked * 2 < held:
        return "the pool tracks less than half of what the engine took"
    if abs(tracked - state.schedule.reading_tracked) > DRIFT * max(state.schedule.reading_tracked, 1):
        return "the pool changed since the last device reading"
    if state.schedule.since_reading + 1 >= every:
        return f"every {every}th sleep"
    return None


def judge(state, tracked: int, freed: int, pool: "int | None" = None) -> tuple:
    """``(effective, likely cause, fix)`` of one sleep. ``pool``: the whole pool's bytes, tags asleep
    before the sleep included (``tracked`` counts only what was mapped): a pool that holds memory is no
    empty pool, however little the sleep had left to free (a KV cache discarded before it, a tiny model)."""
    holds = state.measure.engine_bytes
    if tracked < NOTHING and (pool is None or pool < NOTHING):
        if holds is not None and holds < NOTHING:
            return True, "", ""
        if state.measure.sleep_mode is False:
            return (False, "engine built without enable_sleep_mode (nothing was allocated in the sleep pool)",
                    "build it with enable_sleep_mode=True (TRL: vllm_enable_sleep_mode=True; ms-swift: "
                    "--sleep_level 1 or 2)")
        if state.measure.init_routes and not state.measure.guarded_init:
            return (False, f"expandable segments were on when the engine allocated its memory "
                           f"({', '.join(state.measure.init_routes)}), so it landed outside the sleep pool (pytorch#147851)",
                    "keep the shim's vllm-sleep-guard patch on, or launch with expandable_segments:False in "
                    "PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF")
        return (False, "the sleep allocator instance tracks nothing (CuMemAllocator/CaMemAllocator singleton "
                       "empty or replaced, or expandable segments on through a route the shim could not see)",
                "build one sleep-mode engine per process with expandable_segments:False at construction")
    if freed * 2 < tracked:
        return (False, "the device got back less than half of what the pool tracked (pool memory still mapped "
                       "or referenced elsewhere)",
                "check for a second engine or allocator instance in this process; run SHIM_DEBUG=1")
    return True, "", ""


def capped(probe, freed: int) -> "str | None":
    """Freed, but this process cannot use it: the words of the WARNING where torch's per-process cap
    (``set_per_process_memory_fraction``; vLLM 0.34's extensible KV cache sets one) leaves torch less room
    than the device has free, hiding at least half of what the sleep freed; else None."""
    if not freed or freed < NOTHING:
        return None
    cap = probe.torch_cap()
    if cap is None:
        return None
    limit, reserved = cap
    free = probe.mem_get_info()[0]
    room = max(limit - reserved, 0)
    hidden = min(freed, max(free - room, 0))
    if hidden * 2 < freed:
        return None
    from shim.observe.events import gib

    return (f"the sleep freed {gib(freed)} GiB, but this process cannot use {gib(hidden)} GiB of it: torch's "
            f"per-process memory cap is {gib(limit)} GiB with {gib(reserved)} GiB reserved, room for {gib(room)} "
            f"GiB of the {gib(free)} GiB free; likely cause: vLLM >= 0.34's extensible KV cache "
            f"(set_per_process_memory_fraction, never lifted by a sleep) or a cap set by the program; fix: keep "
            f"the shim's vllm-torch-cap-sleep on, or build the engine with kv_cache_memory_bytes (no extensible "
            f"KV cache)")
