"""The sleep check on vLLM engines: every sleep verified, per-tag wake, telemetry
(patches ``vllm-sleep-check`` on ``LLMEngine`` and ``vllm-llm-sleep-check`` on ``vllm.LLM``).

No double counting: ``LLM.sleep`` delegates to ``LLMEngine.sleep`` (likewise
``wake_up``), state is keyed by the engine (``shim.vllm.engines.engine_of``) and
only the OUTERMOST wrapper of a call on one engine acts: it puts a
``sleep_state.Call`` on the engine's ``SleepState`` for the duration of the
call, and an inner wrapper that finds one of its thread passes straight
through. Construction is the other way round: ``LLM.__init__`` builds its
engine inside, so the engine's own check (``check_init``) records it and the
``LLM`` one (``check_llm_init``) acts only where that did not run (the
engine's ``SleepState.built``).

Sleep verification (every sleep at level >= 1 of an in-process engine): the
bytes the sleep pool tracks (``shim.vllm.sleep.sleep_pool``) against the bytes the sleep
gave back, read on the device (``mem_get_info`` before and after,
``shim.vllm.sleep.memory``) or taken from the pool's bookkeeping: which one, and why that
is safe, is ``shim.vllm.sleep.sleep_verdict``'s rule (first sleep per level, after an
ineffective one, when the bookkeeping looks wrong, and every
``SHIM_DEVICE_CHECK_EVERY``-th sleep read the device; each record's
``measured`` says which). Ineffective (``sleep_verdict.judge``): one WARNING
with the numbers, the likely cause and the fix; the first-sleep reset follows
(``shim.vllm.sleep.first_sleep_reset``).

Each sleep/wake record carries ``shim_s``, the seconds the shim spent around
vLLM's call from the outermost wrapper's entry, the allocator guard's suspend
and resume included (the telemetry line itself excluded); ``seconds`` is
vLLM's call alone.

Sleep while partially awake (e.g. ``wake_up(["weights"])`` then ``sleep()``):
vLLM's executor ignores it ("Executor is already sleeping") and the woken tag
stays mapped; the check wakes the remaining tags first, so the sleep frees
everything.

Faults: whatever vLLM's call raises (an OOM in ``wake_up``, an error or an
interrupt in ``sleep`` or the construction) reaches the caller unchanged; the
engine's ``SleepState`` is re-read from the executor (``sleep_state.resync``),
the ``Call`` is cleared, and the allocator guard's ``finally`` has put the
user's setting back, so the next sleep and wake work as usual.
"""
from __future__ import annotations

import time

from shim.engine import call_args, config, log
from shim.observe import events
from shim.vllm import engines
from shim.vllm.sleep import (
    alloc_guard,
    extensible_kv,
    first_sleep_reset,
    memory,
    sleep_pool,
    sleep_state,
    sleep_verdict,
    wake_plan,
)


class Measured:
    """One sleep's figures: ``tracked`` (pool bytes before), ``freed`` (None: not verified),
    ``free`` / ``total`` (device after; None unless read), ``how`` ("device" | "pool")."""

    __slots__ = ("tracked", "freed", "free", "total", "how")

    def __init__(self, tracked, freed, free, total, how):
        self.tracked, self.freed, self.free, self.total, self.how = tracked, freed, free, total, how


def _vllm_releases_before_wake() -> bool:
    """vLLM >= 0.30 runs gc + empty_cache before waking itself: no second collection."""
    from shim.engine.versions import installed_in

    return installed_in("vllm", ">=0.30.0")


def _executor_asleep(engine) -> "bool | None":
    """Every tag asleep per vLLM's executor (``sleeping_tags``); None where it does not say."""
    tags = engines.reported_asleep(engine)
    return None if tags is None else tags >= set(engines.TAGS)


def _kept_note(engine) -> str:
    """For the sleep line: the plain tensor storages the engine's worker keeps on the host for its weights wake."""
    count, nbytes = engines.kept_on_host(engine)
    if not count:
        return ""
    return (f"plain tensors kept: {count} storage(s), {nbytes} bytes ({events.gib(nbytes)} GiB) copied to "
            f"the host, restored at the weights wake")


def adopt_workers(engine, state) -> None:
    """The engine's in-process workers and engine core get ``state`` as their ``owner``: their own
    wrappers (``shim.vllm.sleep.worker_check``, ``shim.vllm.sleep.core_wake``) pass through while this engine's
    check acts on a call, so one sleep is one record and one wake is planned once. Never raises."""
    try:
        core = engines.in_process_core(engine)
        for held in engines.in_process_workers(engine) + ([core] if core is not None else []):
            sleep_state.state_for(held).owner = state
    except Exception:
        pass


# ---------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------
def check_init(wrapped, instance, args, kwargs):
    """``LLMEngine.__init__``: what the construction took, what the pool tracks, the routes."""
    return _init(wrapped, instance, args, kwargs, full_gc=True)


def check_llm_init(wrapped, instance, args, kwargs):
    """``LLM.__init__``: the same, only where the engine's own ``check_init`` did not run
    (``vllm-sleep-check`` off). Its reading before the call collects only the young
    generations (a full collection costs 0.1-0.5 s, and the engine's check does one)."""
    return _init(wrapped, instance, args, kwargs, full_gc=False)


def _init(wrapped, instance, args, kwargs, full_gc):
    probe = memory.probe()
    want = call_args.requested_sleep_mode(wrapped, args, kwargs)
    routes = alloc_guard.routes_on(probe)
    free0 = memory.read_settled(probe, full_gc=full_gc)[0] if probe is not None else None
    t0 = time.perf_counter()
    result = wrapped(*args, **kwargs)  # an exception reaches the caller as it is: nothing to undo
    seconds = time.perf_counter() - t0
    engine = engines.engine_of(instance)
    state = sleep_state.state_for(engine)
    adopt_workers(engine, state)
    if state.measure.built:  # the engine's own check recorded it (LLM.__init__ builds an LLMEngine inside)
        return result
    state.measure.built = True
    name = sleep_state.engine_name(engine)
    mode = engines.sleep_mode(engine)
    state.measure.sleep_mode = want if mode is None else mode
    state.measure.init_routes = routes or list(state.measure.guard_saw)  # guard_saw: this check ran inside the guard
    if probe is None:
        return result
    free1, total = memory.read_settled(probe)
    state.measure.engine_bytes = max(free0 - free1, 0)
    tracked = sleep_pool.tracked_bytes(probe)
    state.measure.tracked_bytes = tracked
    note = []
    if not state.measure.sleep_mode:
        note.append("built without enable_sleep_mode: sleep cannot free it")
    if state.measure.init_routes:
        note.append(f"expandable segments on via {', '.join(state.measure.init_routes)}"
                    + ("; off during construction (shim guard)" if state.measure.guarded_init else "; NOT guarded"))
    events.emit("init", name, seconds, taken=state.measure.engine_bytes, tracked=tracked, asleep=[],
                   free=free1, total=total, note="; ".join(note))
    return result


# ---------------------------------------------------------------------------
# sleep
# ---------------------------------------------------------------------------
def _holds_memory(engine, state, given) -> bool:
    """``given``, or where None whether ``engine`` has an in-process executor (whose workers the
    state then adopts)."""
    if given is not None:
        return given
    holds = engines.executor_of(engine) is not None
    if holds:
        adopt_workers(engine, state)
    return holds


def check_sleep(wrapped, instance, args, kwargs):
    return sleep_on(engines.engine_of(instance), wrapped, args, kwargs)


def sleep_on(engine, wrapped, args, kwargs, holds_memory=None):
    """The sleep check of one sleep of ``engine``. ``holds_memory``: the device memory is in this
    process (default: the engine has an in-process executor; ``shim.vllm.sleep.worker_check`` passes True
    for vLLM's worker, which holds it wherever it runs)."""
    entered = time.perf_counter()
    state = sleep_state.state_for(engine)
    if state.acting():
        return wrapped(*args, **kwargs)
    holds_memory = _holds_memory(engine, state, holds_memory)
    level = call_args.arg(wrapped, args, kwargs, "level", 1)
    level = level if isinstance(level, int) else None
    probe = memory.probe()
    if probe is None or not holds_memory or level is None or level < 1:
        with state.calling():  # an in-process worker's check passes through here too
            try:
                result = wrapped(*args, **kwargs)
            except BaseException:
                sleep_state.resync(engine, level)
                raise
        sleep_state.note_sleep(engine, 1 if level is None else level)
        return result
    with state.calling():
        return _sleep(engine, state, wrapped, args, kwargs, level, probe, entered)


def _sleep(engine, state, wrapped, args, kwargs, level, probe, entered):
    name = sleep_state.engine_name(engine)
    if state.measure.sleep_mode is None:
        state.measure.sleep_mode = engines.sleep_mode(engine)
    asleep = wake_plan.asleep_tags(engine)
    note = ""
    if asleep and asleep >= set(engines.TAGS):
        t0 = time.perf_counter()
        result = wrapped(*args, **kwargs)  # vLLM: no-op with a warning
        free, total = probe.mem_get_info()
        events.emit("sleep", name, time.perf_counter() - t0, level=level, tracked=sleep_pool.tracked_bytes(probe),
                       freed=0, effective=None, asleep=sorted(asleep), free=free, total=total, measured="device",
                       note="already asleep: vLLM ignores this sleep")
        return result
    if wake_plan.sleep_refused(asleep):
        # vLLM's executor ignores a sleep while any tag (>= 0.31: the weights) is asleep; the awake tag would
        # stay mapped.
        engine.wake_up(sorted(asleep))  # through the allocator guard's wrapper when it is on
        sleep_state.note_wake(engine, asleep)
        note = f"{','.join(sorted(asleep))} was asleep: woke it first, vLLM ignores a sleep while any tag is asleep"
    mapped = set(engines.TAGS) - wake_plan.asleep_tags(engine)  # >= 0.31: a discarded KV cache stays asleep
    outside = extensible_kv.outside_pool_bytes(engine)  # 0.34: the KV cache's pages, outside the pool
    tracked = sleep_pool.tracked_bytes(probe, tags=mapped) + outside
    read = sleep_verdict.reading_due(state, level, tracked, sleep_verdict.check_every()) is not None
    if read:  # a device reading: the verdict on exact figures
        tracked = sleep_pool.tracked_bytes(probe, exact=True, tags=mapped) + outside
    result, t0, t1, m = _measured_sleep(engine, state, wrapped, args, kwargs, level, probe, tracked, read)
    if level >= 2:
        note = "; ".join(x for x in (note, _kept_note(engine)) if x)
    first = state.measure.sleeps == 0
    state.measure.sleeps += 1
    if m.freed is None:  # the executor did not report every tag asleep: nothing to judge from the pool
        effective, cause, fix = None, "", ""
        state.schedule.read_next = True
        note = "; ".join(x for x in (note, "not verified: vLLM does not report every tag asleep after this sleep; "
                                           "the next sleep reads the device") if x)
    else:
        managed = sleep_pool.tracked_bytes(probe) + extensible_kv.outside_pool_bytes(engine, committed=True)
        effective, cause, fix = sleep_verdict.judge(state, m.tracked, m.freed, managed)
        state.schedule.read_next = not effective
        hidden = sleep_verdict.capped(probe, m.freed)
        if hidden:
            note = "; ".join(x for x in (note, "freed, but this process cannot use it (torch memory cap)") if x)
            if not state.measure.capped_warned:
                state.measure.capped_warned = True
                log.warning(f"sleep {name} level={level}: {hidden}.")
    shim_s = (t0 - entered) + (time.perf_counter() - t1)
    events.emit("sleep", name, t1 - t0, level=level, tracked=m.tracked, freed=m.freed, effective=effective,
                   asleep=sorted(state.asleep), free=m.free, total=m.total, measured=m.how, note=note, shim_s=shim_s)
    if effective is None:
        return result
    resolving = state.measure.reset == "pending" and bool(state.measure.wakes) and not first
    if not effective:
        state.measure.ineffective += 1
    if not effective and not resolving and state.measure.reset != "unrecoverable":  # that WARNING said it for every sleep
        held = "" if state.measure.engine_bytes is None else f", the engine took {events.gib(state.measure.engine_bytes)} GiB"
        later = (" The shim re-checks at the sleep after the warm-up (first wake + generate)."
                 if first and state.measure.sleep_mode else "")
        log.warning(f"ineffective sleep {name} level={level}: the device got back {events.gib(m.freed)} GiB, "
                    f"the sleep pool tracked {events.gib(m.tracked)} GiB{held}; likely cause: {cause}; "
                    f"fix: {fix}.{later}")
    if first and not effective and state.measure.sleep_mode:
        state.measure.reset = "pending"
    elif resolving:
        tracked, freed = m.tracked, m.freed
        reissued = not effective
        if reissued:
            def sleep_again():
                return _measured_sleep(engine, state, wrapped, args, kwargs, level, probe,
                                       sleep_pool.tracked_bytes(probe, exact=True), True)

            try:
                effective, tracked, freed, cause = first_sleep_reset.reissue(engine, state, name, level, probe,
                                                                             sleep_again)
            except Exception as exc:  # an extra action of the shim: never the reason training stops
                if config.strict():
                    raise
                log.warning(f"first-sleep reset {name}: re-issuing the sleep failed ({type(exc).__name__}: {exc}); "
                            f"the engine stays as that call left it")
                state.measure.reset = "failed"
                return result
            state.schedule.read_next = not effective
        first_sleep_reset.outcome(state, name, effective, tracked, freed, cause, reissued)
    return result


def _measured_sleep(engine, state, wrapped, args, kwargs, level, probe, tracked, read) -> tuple:
    """vLLM's sleep, between two device readings when ``read``; the engine's state records the
    level, the figures and the reading schedule. Returns ``(result, t0, t1, Measured)`` (t0/t1
    around vLLM's call). An exception of vLLM's call leaves with the state re-read from the executor."""
    free0 = memory.read_before_sleep(probe)[0] if read else None
    t0 = time.perf_counter()
    try:
        result = wrapped(*args, **kwargs)
    except BaseException:
        sleep_state.resync(engine, level)
        raise
    t1 = time.perf_counter()
    after = memory.after_sleep(probe, read)
    sleep_state.note_sleep(engine, level)
    if read:
        free1, total = after
        m = Measured(tracked, max(free1 - free0, 0), free1, total, "device")
        state.schedule.levels_read.add(level)
        state.schedule.since_reading = 0
        state.schedule.reading_tracked = tracked
    else:  # the pool released every handle it tracks once the executor reports every tag asleep
        asleep = _executor_asleep(engine)
        if asleep is False:
            sleep_state.resync(engine)
        m = Measured(tracked, None if asleep is False else tracked, None, None, "pool")
        state.schedule.since_reading += 1
    state.measure.tracked_bytes, state.measure.freed_bytes, state.measure.measured = m.tracked, m.freed, m.how
    return result, t0, t1, m


# ---------------------------------------------------------------------------
# wake
# ---------------------------------------------------------------------------
def check_wake(wrapped, instance, args, kwargs):
    return wake_on(engines.engine_of(instance), wrapped, args, kwargs)


def wake_on(engine, wrapped, args, kwargs, holds_memory=None, as_asked=False):
    """The per-tag wake and its record, for one wake of ``engine`` (``holds_memory``: as :func:`sleep_on`;
    ``as_asked``: vLLM's tags passed unchanged, ``wake_plan.plan``)."""
    entered = time.perf_counter()
    state = sleep_state.state_for(engine)
    if state.acting():
        return wrapped(*args, **kwargs)
    holds_memory = _holds_memory(engine, state, holds_memory)
    tags = call_args.arg(wrapped, args, kwargs, "tags")
    probe = memory.probe()
    if not holds_memory:
        with state.calling():
            try:
                result = wrapped(*args, **kwargs)
            except BaseException:
                sleep_state.resync(engine)
                raise
        sleep_state.note_wake(engine, tags)
        return result
    with state.calling() as call:
        name = sleep_state.engine_name(engine)
        do_call, pass_tags, woken = wake_plan.plan(engine, tags, as_asked)
        if not do_call:
            log.debug(f"wake {name} tags={tags}: all awake already, call skipped (vLLM would ignore it)")
            return None
        if woken and not _vllm_releases_before_wake():
            memory.release_cached(probe)
        read = probe is not None and bool(woken) and state.measure.measured != "pool"  # as the sleep before it
        free0 = probe.mem_get_info()[0] if read else None
        t0 = time.perf_counter()
        try:
            result = wrapped(pass_tags)
        except BaseException:
            sleep_state.resync(engine)
            raise
        t1 = time.perf_counter()
        guard_s = call.guard_s  # the allocator guard's own time, inside the call
        seconds = t1 - t0 - guard_s
        sleep_state.note_wake(engine, woken if tags is not None else None)
        if woken:
            state.measure.wakes += 1
        if probe is not None and woken:
            note = "" if pass_tags == tags else f"asked {','.join(tags)}: the others were awake"
            if read:
                free1, total = probe.mem_get_info()
                restored, tracked, how = max(free0 - free1, 0), sleep_pool.tracked_bytes(probe), "device"
            else:
                by_tag = sleep_pool.bytes_by_tag(probe)
                free1 = total = None
                restored, tracked, how = sum(by_tag.get(t, 0) for t in woken), sum(by_tag.values()), "pool"
            shim_s = (t0 - entered) + guard_s + (time.perf_counter() - t1)
            events.emit("wake", name, seconds, tags=woken, restored=restored, tracked=tracked,
                           asleep=sorted(state.asleep), free=free1, total=total, measured=how, note=note,
                           shim_s=shim_s)
        return result
