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
- ``tracked_bytes`` / ``freed_bytes``: what the sleep pool tracked before the
  last sleep and what that sleep actually freed on the device (filled in by
  the vLLM guard, ``shim.vllm_guard``; ``freed_bytes`` is None until a sleep
  was measured).

Filled in by the vLLM guard as well (for telemetry and the first-sleep check):
``engine`` (a short id, ``LLMEngine#1``), ``sleep_mode`` (built with
``enable_sleep_mode``; None if built before the shim was active),
``engine_bytes`` (device memory the construction took), ``init_routes`` (the
expandable-segments routes that were on at construction), ``guarded_init``
(construction ran inside the allocator guard), ``ineffective`` (count of
ineffective sleeps), ``reset`` (first-sleep reset: ``""``, ``"pending"``,
``"recovered"``, ``"unrecoverable"``), ``wakes`` (count).

The key is the engine object, held by weak reference: ``state_for(llm)`` and
``state_for(llm.llm_engine)`` are the same state, because ``vllm.LLM`` delegates
sleep and wake to its ``llm_engine``.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

TAGS = ("weights", "kv_cache")


@dataclass
class SleepState:
    asleep: set = field(default_factory=set)
    level: Optional[int] = None
    weights_valid: bool = True
    weights_pushed: bool = False
    tracked_bytes: int = 0
    freed_bytes: Optional[int] = None
    sleeps: int = 0
    engine: str = ""
    sleep_mode: Optional[bool] = None
    engine_bytes: Optional[int] = None
    init_routes: list = field(default_factory=list)
    guarded_init: bool = False
    ineffective: int = 0
    reset: str = ""
    wakes: int = 0

    @property
    def weights_asleep(self) -> bool:
        return "weights" in self.asleep

    @property
    def needs_push(self) -> bool:
        """True when generating now would not use the trainer's weights."""
        return self.weights_asleep or not self.weights_valid or not self.weights_pushed


_lock = threading.Lock()
_states: "weakref.WeakKeyDictionary[Any, SleepState]" = weakref.WeakKeyDictionary()
_by_id: dict = {}  # fallback for engines that cannot be weakly referenced


def engine_of(obj: Any) -> Any:
    """The object that owns the sleep state: ``LLM.llm_engine`` or the engine itself."""
    return getattr(obj, "llm_engine", None) or obj


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
