"""Sleep state per vLLM engine: the one "sleep-state flag" every patch consults.

vLLM knows which tags are asleep (``executor.sleeping_tags``) but not what a
woken tag holds: after ``sleep(level=2)`` the weights come back with undefined
contents until something writes them. Trainers guess from their own step
counters, which is how TRL #5312 and the ms-swift level-2 gaps happen. This
module records, per engine:

- ``asleep``: the tags that are asleep now ("weights", "kv_cache");
- ``level``: the level of the last sleep;
- ``weights_valid``: False from a level-2 sleep until weights are written
  (pushed by the trainer or reloaded from disk);
- ``weights_pushed``: True once the trainer's weights were written after the
  last invalidation (False after a reload from disk, which brings back the
  initial checkpoint, not the trained weights);
- ``measure.tracked_bytes`` / ``measure.freed_bytes``: what the sleep pool tracked before the
  last sleep and what that sleep freed (filled in by ``shim.vllm.sleep.sleep_check``;
  ``freed_bytes`` is None until a sleep was measured; ``measured`` says how:
  ``"device"`` (``mem_get_info`` before and after) or ``"pool"`` (the pool's
  own bookkeeping: see ``shim.vllm.sleep.sleep_verdict``).

The fields are grouped by job: the lifecycle above on the state itself (with ``engine``,
a short id such as ``LLMEngine#1``, and ``call``), ``measure`` (:class:`Measurement`: the
byte figures above and what follows) and ``schedule`` (:class:`ReadSchedule`).

Filled in by the sleep check (``shim.vllm.sleep.sleep_check``) in ``measure``, for telemetry and the
first-sleep reset: ``built`` (its
construction was recorded), ``sleep_mode`` (built with ``enable_sleep_mode``;
None if built before the shim was active), ``engine_bytes`` (device memory the
construction took), ``init_routes`` (the expandable-segments routes that were
on at construction), ``ineffective`` (count of ineffective sleeps), ``reset``
(first-sleep reset: ``""``, ``"pending"``, ``"recovered"``, ``"unrecoverable"``,
``"failed"``), ``wakes`` (count); in ``schedule``, when the device is read next
(``levels_read``, ``since_reading``, ``reading_tracked``, ``read_next``).

Filled in by the allocator guard's wrappers (``shim.vllm.sleep.engine_guard``), in ``measure``:
``guarded_init`` (the construction ran inside the allocator guard) and
``guard_saw`` (the routes it turned off there).

``call``: the :class:`Call` of the outermost shim wrapper running on this engine
(None between calls). ``owner`` (a vLLM worker's state only): the state of the in-process
engine whose executor holds this worker (set by that engine's sleep check); while the owner's
``call`` runs in this thread, the worker's own check passes through (``shim.vllm.sleep.worker_check``). Every piece of state the wrappers of two patches share
lives here, on the engine's state, never in a module global or a thread-local.
:func:`resync` re-reads ``asleep`` from vLLM's executor after an upstream call raised.

The key is the engine object, held by weak reference: ``state_for(llm)`` and
``state_for(llm.llm_engine)`` are the same state, because ``vllm.LLM`` delegates
sleep and wake to its ``llm_engine``.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from shim.vllm.engines import TAGS, engine_of, reported_asleep


@dataclass
class Measurement:
    """What the sleep check measured and decided for one engine (``SleepState.measure``)."""

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
    """When the sleep check reads the device next (``SleepState.schedule``; ``shim.vllm.sleep.sleep_verdict``)."""

    levels_read: set = field(default_factory=set)
    since_reading: int = 0
    reading_tracked: int = 0
    read_next: bool = False


@dataclass
class SleepState:
    """One engine's sleep lifecycle (which tags are asleep, at what level, are the weights the
    trainer's), its ``measure`` (:class:`Measurement`) and its device-reading ``schedule``
    (:class:`ReadSchedule`)."""

    asleep: set = field(default_factory=set)
    level: Optional[int] = None
    weights_valid: bool = True
    weights_pushed: bool = False
    engine: str = ""
    call: "Optional[Call]" = None
    owner: "Optional[SleepState]" = None
    measure: Measurement = field(default_factory=Measurement)
    schedule: ReadSchedule = field(default_factory=ReadSchedule)

    @property
    def weights_asleep(self) -> bool:
        return "weights" in self.asleep

    @property
    def needs_push(self) -> bool:
        """True when generating now would not use the trainer's weights."""
        return self.weights_asleep or not self.weights_valid or not self.weights_pushed

    def acting(self) -> bool:
        """An outer shim wrapper's call on this engine is running in this thread: inner wrappers pass through."""
        call = self.call
        return call is not None and call.mine()

    @contextmanager
    def calling(self):
        """A :class:`Call` of this thread on the state for the duration (the previous one back after)."""
        previous, self.call = self.call, Call()
        try:
            yield self.call
        finally:
            self.call = previous


class Call:
    """One call of the outermost sleep-check wrapper on an engine (``SleepState.call``).

    Inner wrappers on the same engine in the same thread (``LLM.sleep`` delegates to
    ``LLMEngine.sleep``) see it and pass straight through; the allocator guard's wake
    wrapper adds its own seconds to ``guard_s``, which the outer wrapper counts as the
    shim's time, not vLLM's."""

    __slots__ = ("thread", "guard_s")

    def __init__(self):
        self.thread = threading.get_ident()
        self.guard_s = 0.0

    def mine(self) -> bool:
        return self.thread == threading.get_ident()


_lock = threading.Lock()
_states: "weakref.WeakKeyDictionary[Any, SleepState]" = weakref.WeakKeyDictionary()
_by_id: dict = {}  # fallback for engines that cannot be weakly referenced


_ids = itertools.count(1)


def engine_name(obj: Any) -> str:
    """The engine's short id in every log line, trace record and verification line (``LLMEngine#1``)."""
    state = state_for(obj)
    if not state.engine:
        with _lock:
            if not state.engine:
                state.engine = f"{type(engine_of(obj)).__name__}#{next(_ids)}"
    return state.engine


def state_for(obj: Any) -> SleepState:
    engine = engine_of(obj)
    with _lock:
        try:
            state = _states.get(engine)
            if state is None:
                state = _states[engine] = SleepState()
        except TypeError:
            state = _by_id.setdefault(id(engine), SleepState())
        return state


def note_sleep(obj: Any, level: int) -> SleepState:
    """All tags asleep; level 2 discards the weights' contents."""
    state = state_for(obj)
    if level and level >= 1:
        state.asleep = set(TAGS)
        state.level = level
        if level >= 2:
            state.weights_valid = False
            state.weights_pushed = False
    return state


def note_wake(obj: Any, tags: Optional[Iterable[str]] = None) -> SleepState:
    state = state_for(obj)
    state.asleep -= set(TAGS if tags is None else tags)
    return state


def note_discard(obj: Any, tags: Iterable[str]) -> SleepState:
    """Tags released without a sleep (vLLM >= 0.31 ``discard``, e.g. the KV cache): asleep, the level kept;
    discarded weights hold nothing defined."""
    state = state_for(obj)
    tags = set(tags) & set(TAGS)
    state.asleep |= tags
    if "weights" in tags:
        state.weights_valid = False
        state.weights_pushed = False
    return state


def note_weights_pushed(obj: Any) -> SleepState:
    """The trainer wrote its weights into awake weight memory."""
    state = state_for(obj)
    if not state.weights_asleep:
        state.weights_valid = True
        state.weights_pushed = True
    return state


def note_weights_reloaded(obj: Any) -> SleepState:
    """Weights re-read from the checkpoint on disk: defined, but not the trainer's."""
    state = state_for(obj)
    state.weights_valid = True
    state.weights_pushed = False
    return state


def resync(obj: Any, level: Optional[int] = None) -> SleepState:
    """After an upstream sleep/wake that raised: the record follows what vLLM's executor
    says is asleep (``sleeping_tags``). A level-2 sleep that failed may have discarded
    part of the weights: they count as discarded (a push is always safe). Never raises."""
    state = state_for(obj)
    try:
        tags = reported_asleep(obj)
        if tags is not None:
            state.asleep = tags & set(TAGS)
        if level is not None and level >= 2:
            state.weights_valid = False
            state.weights_pushed = False
    except Exception:
        pass
    return state
