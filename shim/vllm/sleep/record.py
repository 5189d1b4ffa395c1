"""What a vLLM engine has asleep and whether its weights are the trainer's: :class:`SleepRecord`, the
"sleep-state flag" every patch consults (through the engine's ``shim.vllm.sleep.sleep_state.SleepState``).

vLLM knows which tags are asleep (``executor.sleeping_tags``) but not what a woken tag holds: after
``sleep(level=2)`` the weights come back with undefined contents until something writes them.
Trainers guess from their own step counters, which is how TRL #5312 and the ms-swift level-2 gaps
happen. The record says ``asleep`` (the tags asleep now), ``level`` (of the last sleep),
``weights_valid`` (False from a level-2 sleep until weights are written) and ``weights_pushed`` (the
trainer's weights, not a reload from disk); ``call``: the :class:`Call` of the outermost shim wrapper
running on the engine; ``owner`` (a vLLM worker's or engine core's record): the in-process engine's
state whose calls it passes through.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from shim.vllm import engines
from shim.vllm.engines import TAGS

_lock = threading.Lock()
_ids = itertools.count(1)


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


@dataclass
class SleepRecord:
    """One engine's sleep lifecycle: which tags are asleep, at what level, are the weights the trainer's."""

    asleep: set = field(default_factory=set)
    level: Optional[int] = None
    weights_valid: bool = True
    weights_pushed: bool = False
    engine: str = ""
    call: "Optional[Call]" = None
    owner: "Optional[SleepRecord]" = None
    target: Any = field(default=None, repr=False, compare=False)
    """The engine (a weak reference where it takes one); None for a record built by hand."""

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

    def note_sleep(self, level: int) -> "SleepRecord":
        """All tags asleep; level 2 discards the weights' contents."""
        if level and level >= 1:
            self.asleep = set(TAGS)
            self.level = level
            if level >= 2:
                self.weights_valid = self.weights_pushed = False
        return self

    def note_wake(self, tags: Optional[Iterable[str]] = None) -> "SleepRecord":
        self.asleep -= set(TAGS if tags is None else tags)
        return self

    def note_discard(self, tags: Iterable[str]) -> "SleepRecord":
        """Tags released without a sleep (vLLM >= 0.31 ``discard``, e.g. the KV cache): asleep, the level
        kept; discarded weights hold nothing defined."""
        tags = set(tags) & set(TAGS)
        self.asleep |= tags
        if "weights" in tags:
            self.weights_valid = self.weights_pushed = False
        return self

    def note_weights_pushed(self) -> "SleepRecord":
        """The trainer wrote its weights into awake weight memory."""
        if not self.weights_asleep:
            self.weights_valid = self.weights_pushed = True
        return self

    def note_weights_reloaded(self) -> "SleepRecord":
        """Weights re-read from the checkpoint on disk: defined, but not the trainer's."""
        self.weights_valid, self.weights_pushed = True, False
        return self

    def resync(self, level: Optional[int] = None) -> "SleepRecord":
        """After an upstream sleep/wake that raised: the record follows what vLLM's executor
        says is asleep (``sleeping_tags``). A level-2 sleep that failed may have discarded
        part of the weights: they count as discarded (a push is always safe). Never raises."""
        try:
            tags = engines.reported_asleep(self.engine_object())
            if tags is not None:
                self.asleep = tags & set(TAGS)
            if level is not None and level >= 2:
                self.weights_valid = self.weights_pushed = False
        except Exception:
            pass
        return self

    def asleep_now(self) -> set:
        """Tags vLLM's executor reports asleep (``sleeping_tags``), else the shim's record."""
        tags = engines.reported_asleep(self.engine_object())
        return tags if tags is not None else set(self.asleep)

    def name(self) -> str:
        """The engine's short id in every log line, trace record and verification line (``LLMEngine#1``)."""
        if not self.engine:
            with _lock:
                if not self.engine:
                    self.engine = f"{type(self.engine_object()).__name__}#{next(_ids)}"
        return self.engine

    def engine_object(self):
        """The engine (None where it is gone, or for a record built by hand)."""
        target = self.target
        return target() if isinstance(target, weakref.ref) else target
