"""The sleep state of a vLLM engine, and the object that checks its every sleep and wake.

:class:`SleepState` is the engine's :class:`~shim.vllm.sleep.record.SleepRecord` (the tags asleep, the level,
whether the weights are the trainer's: what every patch consults), with ``measure`` and ``schedule``
(``shim.vllm.sleep.sleep_verdict``): what its sleep check measured and when it reads the device next.
:meth:`SleepState.sleep` and :meth:`SleepState.wake` carry out that check on one call of vLLM's: measure it
(the pool against the device, ``sleep_pool`` / ``memory``), judge it (``sleep_verdict``), re-issue it where the
first-sleep reset says so (``first_sleep_reset``) and record it (``shim.observe.events``);
``shim.vllm.sleep.sleep_check`` holds the patch's wrappers. Every piece of state two patches share lives on
it, never in a module global or a thread-local. The key is the engine object, held by weak reference:
``state_for(llm)`` and ``state_for(llm.llm_engine)`` are the same state (``vllm.LLM`` delegates to its
``llm_engine``).
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from shim.engine import call_args, config, log
from shim.observe import events
from shim.vllm import engines
from shim.vllm.engines import TAGS
from shim.vllm.sleep import first_sleep_reset, memory, sleep_pool, sleep_verdict, wake_plan
from shim.vllm.sleep.record import SleepRecord
from shim.vllm.sleep.sleep_verdict import Measured, Measurement, ReadSchedule


@dataclass
class SleepState(SleepRecord):
    """One engine's sleep record (:class:`~shim.vllm.sleep.record.SleepRecord`), what its sleep check
    measured (``measure``) and when it reads the device next (``schedule``), and the check's steps."""

    measure: Measurement = field(default_factory=Measurement)
    schedule: ReadSchedule = field(default_factory=ReadSchedule)

    # -- the sleep check ---------------------------------------------------------------------------
    def holds_memory(self, given: "bool | None" = None) -> bool:
        """``given``, or where None whether the engine has an in-process executor (whose workers and
        engine core then get this state as their ``owner``: :meth:`adopt_workers`)."""
        if given is not None:
            return given
        holds = engines.executor_of(self.engine_object()) is not None
        if holds:
            self.adopt_workers()
        return holds

    def adopt_workers(self) -> None:
        """The engine's in-process workers and engine core get this state as their ``owner``: their own
        wrappers (``worker_check``, ``core_wake``) pass through while this engine's check acts on a call,
        so one sleep is one record and one wake is planned once. Never raises."""
        try:
            engine = self.engine_object()
            core = engines.in_process_core(engine)
            for held in engines.in_process_workers(engine) + ([core] if core is not None else []):
                state_for(held).owner = self
        except Exception:
            pass

    def _unmeasured(self, upstream, level=None, woken=None, sleeping=False):
        """vLLM's call with nothing measured (no device, no memory in this process, level 0): its
        record kept (``sleeping``: a sleep at ``level``, else a wake of ``woken``), the state re-read
        from the executor where it raised."""
        with self.calling():  # an in-process worker's check passes through here too
            try:
                result = upstream()
            except BaseException:
                self.resync(level)
                raise
        if sleeping:
            self.note_sleep(1 if level is None else level)
        else:
            self.note_wake(woken)
        return result

    def sleep(self, wrapped, args, kwargs, holds_memory=None, entered=None):
        """The sleep check of one sleep (``holds_memory``: the device memory is in this process;
        default: the engine has an in-process executor; ``worker_check`` passes True for vLLM's
        worker, which holds it wherever it runs; ``entered``: when the outermost wrapper was)."""
        entered = time.perf_counter() if entered is None else entered
        if self.acting():
            return wrapped(*args, **kwargs)
        holds = self.holds_memory(holds_memory)
        upstream = functools.partial(wrapped, *args, **kwargs)
        level = call_args.arg(wrapped, args, kwargs, "level", 1)
        level = level if isinstance(level, int) else None
        probe = memory.probe()
        if probe is None or not holds or level is None or level < 1:
            return self._unmeasured(upstream, level, sleeping=True)
        with self.calling():
            return self._sleep(upstream, level, probe, entered)

    def _sleep(self, upstream, level, probe, entered):
        name = self.name()
        if self.measure.sleep_mode is None:
            self.measure.sleep_mode = engines.sleep_mode(self.engine_object())
        asleep = self.asleep_now()
        if asleep and asleep >= set(TAGS):
            t0 = time.perf_counter()
            result = upstream()  # vLLM: no-op with a warning
            free, total = probe.mem_get_info()
            events.emit("sleep", name, time.perf_counter() - t0, level=level, freed=0, effective=None,
                        tracked=sleep_pool.tracked_bytes(probe), asleep=sorted(asleep), free=free, total=total,
                        measured="device", note="already asleep: vLLM ignores this sleep")
            return result
        notes = []
        if wake_plan.sleep_refused(asleep):
            # vLLM's executor ignores a sleep while any tag (>= 0.31: the weights) is asleep; the awake tag
            # would stay mapped.
            self.engine_object().wake_up(sorted(asleep))  # through the allocator guard's wrapper when it is on
            self.note_wake(asleep)
            notes.append(f"{','.join(sorted(asleep))} was asleep: woke it first, vLLM ignores a sleep while any "
                         f"tag is asleep")
        mapped = set(TAGS) - self.asleep_now()  # >= 0.31: a discarded KV cache stays asleep
        outside = engines.outside_pool_bytes(self.engine_object())  # 0.34: the KV cache's pages, outside the pool
        tracked = sleep_pool.tracked_bytes(probe, tags=mapped) + outside
        read = sleep_verdict.reading_due(self, level, tracked, sleep_verdict.check_every()) is not None
        if read:  # a device reading: the verdict on exact figures
            tracked = sleep_pool.tracked_bytes(probe, exact=True, tags=mapped) + outside
        result, m = self._measured(upstream, level, probe, tracked, read)
        if level >= 2:
            notes.append(self._kept_note())
        self.measure.sleeps += 1
        verdict = self._judge(probe, m, notes)
        events.emit("sleep", name, m.t1 - m.t0, level=level, tracked=m.tracked, freed=m.freed,
                    effective=verdict[0], asleep=sorted(self.asleep), free=m.free, total=m.total, measured=m.how,
                    note="; ".join(x for x in notes if x), shim_s=(m.t0 - entered) + (time.perf_counter() - m.t1))
        if verdict[0] is not None:
            self._first_sleep_reset(upstream, probe, m, verdict)
        return result

    def _measured(self, upstream, level, probe, tracked, read) -> tuple:
        """vLLM's sleep, between two device readings when ``read``; the state records the level, the
        figures and the reading schedule. Returns ``(result, Measured)``. An exception of vLLM's call
        leaves with the state re-read from the executor."""
        free0 = memory.read_before_sleep(probe)[0] if read else None
        t0 = time.perf_counter()
        try:
            result = upstream()
        except BaseException:
            self.resync(level)
            raise
        t1 = time.perf_counter()
        after = memory.after_sleep(probe, read)
        self.note_sleep(level)
        m = Measured(level, tracked, t0, t1)
        if read:
            m.free, m.total = after
            m.freed, m.how = max(m.free - free0, 0), "device"
            self.schedule.levels_read.add(level)
            self.schedule.since_reading = 0
            self.schedule.reading_tracked = tracked
        else:  # the pool released every handle it tracks once the executor reports every tag asleep
            tags = engines.reported_asleep(self.engine_object())
            unverified = tags is not None and not tags >= set(TAGS)
            if unverified:
                self.resync()
            m.freed = None if unverified else tracked
            self.schedule.since_reading += 1
        self.measure.tracked_bytes, self.measure.freed_bytes, self.measure.measured = m.tracked, m.freed, m.how
        return result, m

    def _judge(self, probe, m, notes) -> tuple:
        """``(effective, cause, fix)`` of the sleep measured as ``m`` (``effective`` None: not verified), the
        schedule set from it; the notes of its line appended to ``notes``."""
        if m.freed is None:  # the executor did not report every tag asleep: nothing to judge from the pool
            self.schedule.read_next = True
            notes.append("not verified: vLLM does not report every tag asleep after this sleep; "
                         "the next sleep reads the device")
            return None, "", ""
        managed = sleep_pool.tracked_bytes(probe) + engines.outside_pool_bytes(self.engine_object(), committed=True)
        effective, cause, fix = sleep_verdict.judge(self, m.tracked, m.freed, managed)
        self.schedule.read_next = not effective
        hidden = sleep_verdict.capped(probe, m.freed)
        if hidden:
            notes.append("freed, but this process cannot use it (torch memory cap)")
            if not self.measure.capped_warned:
                self.measure.capped_warned = True
                log.warning(f"sleep {self.name()} level={m.level}: {hidden}.")
        return effective, cause, fix

    def _kept_note(self) -> str:
        count, nbytes = engines.kept_on_host(self.engine_object())
        if not count:
            return ""
        return (f"plain tensors kept: {count} storage(s), {nbytes} bytes ({events.gib(nbytes)} GiB) copied to "
                f"the host, restored at the weights wake")

    def _first_sleep_reset(self, upstream, probe, m, verdict) -> None:
        """The ineffective-sleep WARNING and the first-sleep reset (``first_sleep_reset``) after the sleep
        measured as ``m`` and judged ``(effective, cause, fix)``."""
        (effective, cause, fix), name, measure, level = verdict, self.name(), self.measure, m.level
        first = measure.sleeps == 1
        resolving = measure.reset == "pending" and bool(measure.wakes) and not first
        if not effective:
            measure.ineffective += 1
        if not effective and not resolving and measure.reset != "unrecoverable":  # that WARNING said it for every sleep
            held = "" if measure.engine_bytes is None else f", the engine took {events.gib(measure.engine_bytes)} GiB"
            later = (" The shim re-checks at the sleep after the warm-up (first wake + generate)."
                     if first and measure.sleep_mode else "")
            log.warning(f"ineffective sleep {name} level={level}: the device got back {events.gib(m.freed)} GiB, "
                        f"the sleep pool tracked {events.gib(m.tracked)} GiB{held}; likely cause: {cause}; "
                        f"fix: {fix}.{later}")
        if first and not effective and measure.sleep_mode:
            measure.reset = "pending"
        elif resolving and effective:
            self.reset_outcome(True, m.tracked, m.freed, cause)
        elif resolving:
            try:
                m, effective, cause = self._reissue(upstream, level, probe)
            except Exception as exc:  # an extra action of the shim: never the reason training stops
                if config.strict():
                    raise
                log.warning(f"first-sleep reset {name}: re-issuing the sleep failed ({type(exc).__name__}: {exc}); "
                            f"the engine stays as that call left it")
                measure.reset = "failed"
                return
            self.schedule.read_next = not effective
            self.reset_outcome(effective, m.tracked, m.freed, cause, reissued=True)

    def _reissue(self, upstream, level, probe) -> tuple:
        """The reset's second attempt, once per engine: wake every tag (through the allocator guard's
        wrapper when it is on; the sleep check passes through), give the cached blocks back, then
        vLLM's sleep again between two device readings, recorded. Returns ``(Measured, effective, cause)``."""
        self.engine_object().wake_up()
        self.note_wake(None)
        memory.release_cached(probe)
        m = self._measured(upstream, level, probe, sleep_pool.tracked_bytes(probe, exact=True), True)[1]
        effective, cause, _ = sleep_verdict.judge(self, m.tracked, m.freed)
        events.emit("sleep", self.name(), m.t1 - m.t0, level=level, tracked=m.tracked, freed=m.freed,
                    effective=effective, asleep=sorted(self.asleep), free=m.free, total=m.total, measured=m.how,
                    note="first-sleep reset: re-issued")
        return m, effective, cause

    def reset_outcome(self, effective, tracked, freed, cause, reissued=False) -> None:
        """The first-sleep reset's result, logged and recorded in ``measure.reset``; strict mode raises
        when unrecoverable."""
        if effective:
            self.measure.reset = "recovered"
            log.info(first_sleep_reset.recovered(self.name(), tracked, freed, reissued))
            return
        self.measure.reset = "unrecoverable"
        message = first_sleep_reset.unrecoverable(self.name(), tracked, freed, cause, self.measure.engine_bytes)
        log.warning(message)
        if config.strict():
            raise RuntimeError(f"[shim] {message} ({config.SHIM_STRICT}=1)")

    def wake(self, wrapped, args, kwargs, holds_memory=None, as_asked=False, entered=None):
        """The per-tag wake and its record, for one wake (``holds_memory``, ``entered``: as :meth:`sleep`;
        ``as_asked``: vLLM's tags passed unchanged, ``wake_plan.plan``)."""
        entered = time.perf_counter() if entered is None else entered
        if self.acting():
            return wrapped(*args, **kwargs)
        holds = self.holds_memory(holds_memory)
        tags = call_args.arg(wrapped, args, kwargs, "tags")
        probe = memory.probe()
        if not holds:
            return self._unmeasured(functools.partial(wrapped, *args, **kwargs), woken=tags)
        with self.calling() as call:
            name = self.name()
            do_call, pass_tags, woken = wake_plan.plan(None if as_asked else self.asleep_now(), tags)
            if not do_call:
                log.debug(f"wake {name} tags={tags}: all awake already, call skipped (vLLM would ignore it)")
                return None
            if woken and not wake_plan.releases_before_wake():
                memory.release_cached(probe)
            read = probe is not None and bool(woken) and self.measure.measured != "pool"  # as the sleep before it
            free0 = probe.mem_get_info()[0] if read else None
            t0 = time.perf_counter()
            try:
                result = wrapped(pass_tags)
            except BaseException:
                self.resync()
                raise
            t1 = time.perf_counter()
            guard_s = call.guard_s  # the allocator guard's own time, inside the call
            self.note_wake(woken if tags is not None else None)
            if woken:
                self.measure.wakes += 1
            if probe is None or not woken:
                return result
            note = "" if pass_tags == tags else f"asked {','.join(tags)}: the others were awake"
            if read:
                free1, total = probe.mem_get_info()
                restored, tracked, how = max(free0 - free1, 0), sleep_pool.tracked_bytes(probe), "device"
            else:
                by_tag = sleep_pool.bytes_by_tag(probe)
                free1 = total = None
                restored, tracked, how = sum(by_tag.get(t, 0) for t in woken), sum(by_tag.values()), "pool"
            shim_s = (t0 - entered) + guard_s + (time.perf_counter() - t1)
            events.emit("wake", name, t1 - t0 - guard_s, tags=woken, restored=restored, tracked=tracked,
                        asleep=sorted(self.asleep), free=free1, total=total, measured=how, note=note, shim_s=shim_s)
            return result

    def wake_tags(self, tags, call, release: bool = True):
        """Wake ``tags`` through ``call(tags)`` (vLLM's wake_up), per tag (the TRL proxy's wake).
        Returns ``(result, woken_tags, called)``."""
        do_call, pass_tags, woken = wake_plan.plan(self.asleep_now(), tags)
        if not do_call:
            return None, [], False
        if release and woken:
            memory.release_cached()
        result = call(pass_tags)
        self.note_wake(woken if tags is not None else None)
        return result, woken, True


_lock = threading.Lock()
_states: "weakref.WeakKeyDictionary[Any, SleepState]" = weakref.WeakKeyDictionary()
_by_id: dict = {}  # fallback for engines that cannot be weakly referenced (their state holds them: no id reused)


def state_for(obj: Any) -> SleepState:
    engine = engines.engine_of(obj)
    with _lock:
        try:
            state = _states.get(engine)
            if state is None:
                state = _states[engine] = SleepState(target=weakref.ref(engine))
        except TypeError:
            state = _by_id.get(id(engine))
            if state is None:
                state = _by_id[id(engine)] = SleepState(target=engine)
        return state


# The record's steps for callers that hold an engine (or ``vllm.LLM``), not its state.
def engine_name(obj: Any) -> str:
    return state_for(obj).name()


def note_sleep(obj: Any, level: int) -> SleepState:
    return state_for(obj).note_sleep(level)


def note_wake(obj: Any, tags: Optional[Iterable[str]] = None) -> SleepState:
    return state_for(obj).note_wake(tags)


def resync(obj: Any, level: Optional[int] = None) -> SleepState:
    return state_for(obj).resync(level)


def note_discard(obj: Any, tags: Iterable[str]) -> SleepState:
    return state_for(obj).note_discard(tags)


def note_weights_pushed(obj: Any) -> SleepState:
    return state_for(obj).note_weights_pushed()


def note_weights_reloaded(obj: Any) -> SleepState:
    return state_for(obj).note_weights_reloaded()
