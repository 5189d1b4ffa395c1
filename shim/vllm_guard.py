"""Engine-level sleep guard for vLLM: allocator guard, verified sleeps, per-tag wake, telemetry.

Bound to vLLM's names by ``patches/vllm_sleep_guard.py``; this module holds the
behaviour, shared by the wrappers on ``vllm.LLM`` and on the engine class
trainers call directly (``vllm.v1.engine.llm_engine.LLMEngine``, what ms-swift
holds as ``engine.engine``).

No double counting: ``LLM.sleep`` delegates to ``LLMEngine.sleep`` (and so on
for ``wake_up`` and ``__init__``); state is keyed by the engine
(``shim.sleep_state.engine_of``) and only the OUTERMOST wrapper of a call on
one engine acts (a per-thread set of busy engines; a per-thread depth for
construction), the inner one passes straight through.

Sleep verification (every sleep at level >= 1 of an in-process engine): the
bytes the sleep allocator tracks (``CuMemAllocator`` / vllm-ascend
``CaMemAllocator`` ``instance.get_current_usage()``, read before sleeping,
never creating the singleton) against the device memory the sleep gave back
(``mem_get_info`` before and after; before: synchronize + ``empty_cache``;
after: vLLM's sleep has run gc + ``empty_cache`` itself on CUDA, the shim does
on NPU). Each sleep/wake record carries ``shim_s``, the seconds the shim spent
around vLLM's call, from the outermost wrapper's entry, the allocator guard's
suspend/resume included (the telemetry line itself excluded); ``seconds`` is
vLLM's call alone.
Ineffective: less than half of the tracked bytes came back, or the pool tracks
about nothing (< 64 MiB) while the engine holds memory. One WARNING line with
the numbers, the likely cause and the fix.

First-sleep reset: when the first sleep after construction was ineffective, the
sleep after the warm-up (the first wake + generate cycle; the trainer issues it)
is re-checked. Effective: logged as recovered. Ineffective again: the shim
re-issues it once there (wake every tag with the allocator guard on, gc +
``empty_cache``, sleep, measure), which frees what was still referenced or
cached at the first sleep. Still ineffective: the memory was allocated outside
the pool and no run-time action gives it back (on the device the pages belong to
PyTorch's caching allocator, not to vLLM's pool); one WARNING says so, with the
number of GiB; ``SHIM_STRICT=1`` raises.

Sleep while partially awake (e.g. ``wake_up(["weights"])`` then ``sleep()``):
vLLM's executor ignores it ("Executor is already sleeping") and the woken tag
stays mapped; the guard wakes the remaining tags first, so the sleep frees
everything.
"""
from __future__ import annotations

import gc
import inspect
import itertools
import sys
import threading
import time
from contextlib import contextmanager

from shim import alloc_guard, config, log, memory, sleep_ops, sleep_state, telemetry

MiB = 1 << 20
NOTHING = 64 * MiB
"""A pool tracking less than this 'tracks about nothing'."""

GUARD_APPLIED = False
"""Set (through the patcher, so it is undone) by the ``vllm-sleep-guard`` patch."""

_ids = itertools.count(1)
_local = threading.local()

_ALLOCATORS = {
    "cuda": ("vllm.device_allocator.cumem", "CuMemAllocator"),
    "npu": ("vllm_ascend.device_allocator.camem", "CaMemAllocator"),
}


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def sleep_allocator(device: str):
    """The sleep allocator singleton of ``device`` if it exists (never created here)."""
    mod_name, cls_name = _ALLOCATORS.get(device, (None, None))
    cls = getattr(sys.modules.get(mod_name or ""), cls_name or "", None)
    return vars(cls).get("instance") if isinstance(cls, type) else None


def tracked_bytes(probe) -> int:
    alloc = sleep_allocator(probe.name) if probe is not None else None
    if alloc is None:
        return 0
    try:
        return int(alloc.get_current_usage())
    except Exception:
        return 0


def measure(probe, full_gc: bool = False) -> tuple:
    """(free, total) after synchronize, gc and empty_cache (engine construction).

    The collection is of the young generations unless ``full_gc``: a full one
    costs ~0.1-0.5 s in a training process.
    """
    probe.synchronize()
    gc.collect(2 if full_gc else 1)
    probe.empty_cache()
    return probe.mem_get_info()


def measure_before_sleep(probe) -> tuple:
    """(free, total) right before a sleep: synchronize, cached blocks given back, read.

    No gc: garbage that still holds device tensors is collected by the sleep
    itself (``CuMemAllocator.sleep`` ends with ``gc.collect()`` +
    ``empty_cache``) and then counts as freed by it, as it does in vLLM's own
    figure; a young-generation collection here would cost milliseconds per
    sleep for that sliver.
    """
    probe.synchronize()
    probe.empty_cache()
    return probe.mem_get_info()


def measure_after_sleep(probe) -> tuple:
    """(free, total) right after a sleep. vLLM's ``CuMemAllocator.sleep`` ends with
    ``gc.collect()`` + ``torch.cuda.empty_cache()``: on CUDA only the read is left.
    vllm-ascend's ``CaMemAllocator.sleep`` does neither (vllm-ascend#9563): on NPU
    the young garbage is collected and the cached blocks given back here."""
    probe.synchronize()
    if probe.name != "cuda":
        gc.collect(1)
        probe.empty_cache()
    return probe.mem_get_info()


_signatures: dict = {}


def _signature(wrapped):
    """``inspect.signature`` of a callable, cached per underlying function (~0.1 ms a call
    uncached, on every sleep and wake). Bound methods of one function share a signature."""
    key = getattr(wrapped, "__func__", wrapped)
    try:
        return _signatures[key]
    except (KeyError, TypeError):
        pass
    sig = inspect.signature(wrapped)
    try:
        _signatures[key] = sig
    except TypeError:  # unhashable callable
        pass
    return sig


def arg(wrapped, args, kwargs, name, default=None):
    """Argument ``name`` of a call, bound by name (signatures change between releases)."""
    if name in kwargs:
        return kwargs[name]
    try:
        bound = _signature(wrapped).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return default
    if name in bound.arguments:
        return bound.arguments[name]
    for value in bound.arguments.values():  # **kwargs of the callee
        if isinstance(value, dict) and name in value:
            return value[name]
    return default


def engine_sleep_mode(engine) -> "bool | None":
    for cfg in (getattr(getattr(engine, "vllm_config", None), "model_config", None),
                getattr(engine, "model_config", None)):
        value = getattr(cfg, "enable_sleep_mode", None)
        if value is not None:
            return bool(value)
    return None


def _requested_sleep_mode(wrapped, args, kwargs) -> "bool | None":
    value = arg(wrapped, args, kwargs, "enable_sleep_mode")
    if value is not None:
        return bool(value)
    for name in ("vllm_config", "engine_args"):
        cfg = arg(wrapped, args, kwargs, name)
        if cfg is not None:
            mc = getattr(cfg, "model_config", cfg)
            if getattr(mc, "enable_sleep_mode", None) is not None:
                return bool(mc.enable_sleep_mode)
    return None


def _busy() -> set:
    busy = getattr(_local, "busy", None)
    if busy is None:
        busy = _local.busy = set()
    return busy


@contextmanager
def _owning(engine):
    busy = _busy()
    busy.add(id(engine))
    try:
        yield
    finally:
        busy.discard(id(engine))


def _name(engine, state) -> str:
    if not state.engine:
        state.engine = f"{type(engine).__name__}#{next(_ids)}"
    return state.engine


def _routes(probe) -> list:
    routes = list(alloc_guard.env_routes())
    if alloc_guard.live_expandable(probe):
        routes.append("live setting")
    return routes


_RELEASES: list = []


def _vllm_releases_before_wake() -> bool:
    """vLLM >= 0.30 runs gc + empty_cache before waking itself: no second full gc."""
    if not _RELEASES:
        from shim.versions import in_range, installed

        version = installed("vllm")
        _RELEASES.append(bool(version) and in_range(version, ">=0.30.0"))
    return _RELEASES[0]


def _strict() -> bool:
    try:
        return config.strict()
    except config.ConfigError:
        return False


# ---------------------------------------------------------------------------
# allocator guard wrappers (patch vllm-sleep-guard)
# ---------------------------------------------------------------------------
def guard_init(wrapped, instance, args, kwargs):
    """Construction of a sleep-mode engine with expandable segments off."""
    probe = memory.probe()
    if probe is None or not _requested_sleep_mode(wrapped, args, kwargs):
        return wrapped(*args, **kwargs)
    with alloc_guard.expandable_segments_off(probe):
        return wrapped(*args, **kwargs)


def guard_wake(wrapped, instance, args, kwargs):
    """``wake_up`` of a sleep-mode engine with expandable segments off.

    Its own seconds (suspend + resume) are added to ``_local.guard_s``, which the
    outer ``check_wake`` counts as the shim's, not vLLM's."""
    t0 = time.perf_counter()
    probe = memory.probe()
    if probe is None or engine_sleep_mode(sleep_state.engine_of(instance)) is False:
        return wrapped(*args, **kwargs)
    token = alloc_guard.suspend(probe)
    t1 = time.perf_counter()
    try:
        return wrapped(*args, **kwargs)
    finally:
        t2 = time.perf_counter()
        alloc_guard.resume(token)
        _local.guard_s = getattr(_local, "guard_s", 0.0) + (t1 - t0) + (time.perf_counter() - t2)


# ---------------------------------------------------------------------------
# verification / telemetry wrappers (patches vllm-sleep-check, vllm-llm-sleep-check)
# ---------------------------------------------------------------------------
def check_init(wrapped, instance, args, kwargs):
    depth = getattr(_local, "init", 0)
    if depth:
        return wrapped(*args, **kwargs)
    probe = memory.probe()
    want = _requested_sleep_mode(wrapped, args, kwargs)
    routes = _routes(probe)
    free0 = measure(probe, full_gc=True)[0] if probe is not None else None
    _local.init = depth + 1
    t0 = time.perf_counter()
    try:
        result = wrapped(*args, **kwargs)
    finally:
        _local.init = depth
    seconds = time.perf_counter() - t0
    engine = sleep_state.engine_of(instance)
    state = sleep_state.state_for(engine)
    name = _name(engine, state)
    mode = engine_sleep_mode(engine)
    state.sleep_mode = want if mode is None else mode
    state.init_routes = routes
    state.guarded_init = bool(GUARD_APPLIED and state.sleep_mode)
    if probe is None:
        return result
    free1, total = measure(probe)
    state.engine_bytes = max(free0 - free1, 0)
    tracked = tracked_bytes(probe)
    state.tracked_bytes = tracked
    note = []
    if not state.sleep_mode:
        note.append("built without enable_sleep_mode: sleep cannot free it")
    if routes:
        note.append(f"expandable segments on via {', '.join(routes)}"
                    + ("; off during construction (shim guard)" if state.guarded_init else "; NOT guarded"))
    telemetry.emit("init", name, seconds, taken=state.engine_bytes, tracked=tracked, asleep=[],
                   free=free1, total=total, note="; ".join(note))
    return result


def check_sleep(wrapped, instance, args, kwargs):
    entered = time.perf_counter()
    engine = sleep_state.engine_of(instance)
    if id(engine) in _busy():
        return wrapped(*args, **kwargs)
    level = arg(wrapped, args, kwargs, "level", 1)
    probe = memory.probe()
    if probe is None or sleep_ops.executor_of(engine) is None or not isinstance(level, int) or level < 1:
        result = wrapped(*args, **kwargs)
        sleep_state.note_sleep(engine, level if isinstance(level, int) else 1)
        return result
    with _owning(engine):
        return _sleep(engine, wrapped, args, kwargs, level, probe, entered)


def _sleep(engine, wrapped, args, kwargs, level, probe, entered):
    state = sleep_state.state_for(engine)
    name = _name(engine, state)
    if state.sleep_mode is None:
        state.sleep_mode = engine_sleep_mode(engine)
    asleep = sleep_ops.asleep_tags(engine)
    note = ""
    if asleep and asleep >= set(sleep_ops.TAGS):
        t0 = time.perf_counter()
        result = wrapped(*args, **kwargs)  # vLLM: no-op with a warning
        free, total = probe.mem_get_info()
        telemetry.emit("sleep", name, time.perf_counter() - t0, level=level, tracked=tracked_bytes(probe), freed=0,
                       effective=None, asleep=sorted(asleep), free=free, total=total,
                       note="already asleep: vLLM ignores this sleep")
        return result
    if asleep:
        # vLLM's executor ignores a sleep while any tag is asleep; the awake tag would stay mapped.
        engine.wake_up(sorted(asleep))  # through the allocator guard's wrapper when it is on
        sleep_state.note_wake(engine, asleep)
        note = f"{','.join(sorted(asleep))} was asleep: woke it first, vLLM ignores a sleep while any tag is asleep"
    result, t0, t1, tracked, freed, free1, total = _measured_sleep(engine, state, wrapped, args, kwargs, level,
                                                                  probe)
    effective, cause, fix = judge(state, tracked, freed)
    first = state.sleeps == 0
    state.sleeps += 1
    shim_s = (t0 - entered) + (time.perf_counter() - t1)
    telemetry.emit("sleep", name, t1 - t0, level=level, tracked=tracked, freed=freed, effective=effective,
                   asleep=sorted(state.asleep), free=free1, total=total, note=note, shim_s=shim_s)
    resolving = state.reset == "pending" and bool(state.wakes) and not first
    if not effective:
        state.ineffective += 1
    if not effective and not resolving and state.reset != "unrecoverable":  # that WARNING said it for every sleep
        held = "" if state.engine_bytes is None else f", the engine took {telemetry.gib(state.engine_bytes)} GiB"
        later = (" The shim re-checks at the sleep after the warm-up (first wake + generate)."
                 if first and state.sleep_mode else "")
        log.warning(f"ineffective sleep {name} level={level}: the device got back {telemetry.gib(freed)} GiB, "
                    f"the sleep pool tracked {telemetry.gib(tracked)} GiB{held}; likely cause: {cause}; "
                    f"fix: {fix}.{later}")
    if first and not effective and state.sleep_mode:
        state.reset = "pending"
    elif resolving:
        reissued = not effective
        if reissued:
            try:
                effective, tracked, freed, cause = _reissue(engine, state, name, wrapped, args, kwargs, level, probe)
            except Exception as exc:  # an extra action of the shim: never the reason training stops
                if _strict():
                    raise
                log.warning(f"first-sleep reset {name}: re-issuing the sleep failed ({type(exc).__name__}: {exc}); "
                            f"the engine stays as that call left it")
                state.reset = "failed"
                return result
        _reset_outcome(state, name, effective, tracked, freed, cause, reissued)
    return result


def _reissue(engine, state, name, wrapped, args, kwargs, level, probe) -> tuple:
    """The reset's second attempt, once per engine: wake every tag (allocator guard on), give the
    cached blocks back, sleep again, measure. Frees what a first sleep left mapped or cached
    (pool memory still referenced then, blocks PyTorch had cached); memory allocated outside the
    pool stays where it is. Returns ``(effective, tracked, freed, cause)`` of the re-issued sleep."""
    engine.wake_up()  # through the allocator guard's wrapper when it is on; this wrapper passes through
    sleep_state.note_wake(engine, None)
    memory.release_cached(probe)
    _, t0, t1, tracked, freed, free1, total = _measured_sleep(engine, state, wrapped, args, kwargs, level, probe)
    effective, cause, _ = judge(state, tracked, freed)
    telemetry.emit("sleep", name, t1 - t0, level=level, tracked=tracked, freed=freed, effective=effective,
                   asleep=sorted(state.asleep), free=free1, total=total, note="first-sleep reset: re-issued")
    return effective, tracked, freed, cause


def _measured_sleep(engine, state, wrapped, args, kwargs, level, probe) -> tuple:
    """vLLM's sleep between the two device readings; the engine's state records the level and the
    bytes. Returns ``(result, t0, t1, tracked, freed, free_after, total)`` (t0/t1 around vLLM's call)."""
    tracked = tracked_bytes(probe)
    free0, _ = measure_before_sleep(probe)
    t0 = time.perf_counter()
    result = wrapped(*args, **kwargs)
    t1 = time.perf_counter()
    free1, total = measure_after_sleep(probe)
    freed = max(free1 - free0, 0)
    state.tracked_bytes, state.freed_bytes = tracked, freed
    sleep_state.note_sleep(engine, level)
    return result, t0, t1, tracked, freed, free1, total


def _reset_outcome(state, name, effective, tracked, freed, cause, reissued=False) -> None:
    if effective:
        state.reset = "recovered"
        how = "the re-issued sleep" if reissued else "the sleep"
        log.info(f"first-sleep reset {name}: after the warm-up {how} freed {telemetry.gib(freed)} GiB of "
                 f"{telemetry.gib(tracked)} GiB tracked; the first sleep's gap is closed")
        return
    state.reset = "unrecoverable"
    outside = None if state.engine_bytes is None else max(state.engine_bytes - tracked, 0)
    amount = "this engine's memory" if outside is None else f"{telemetry.gib(outside)} GiB of this engine's memory"
    message = (f"first-sleep reset {name}: the sleep after the warm-up, re-issued, is still ineffective (the device got back "
               f"{telemetry.gib(freed)} GiB, the pool tracked {telemetry.gib(tracked)} GiB): {amount} was allocated outside "
               f"the sleep pool ({cause}) and cannot be released at run time; every sleep of this engine will "
               f"free ~{telemetry.gib(freed)} GiB. Rebuild the engine with expandable segments off at "
               f"construction (keep the shim's vllm-sleep-guard on, or set expandable_segments:False in the "
               f"allocator env vars)")
    log.warning(message)
    if _strict():
        raise RuntimeError(f"[shim] {message} ({config.SHIM_STRICT}=1)")


def judge(state, tracked: int, freed: int) -> tuple:
    """``(effective, likely cause, fix)`` of one sleep."""
    holds = state.engine_bytes
    if tracked < NOTHING:
        if holds is not None and holds < NOTHING:
            return True, "", ""
        if state.sleep_mode is False:
            return (False, "engine built without enable_sleep_mode (nothing was allocated in the sleep pool)",
                    "build it with enable_sleep_mode=True (TRL: vllm_enable_sleep_mode=True; ms-swift: "
                    "--sleep_level 1 or 2)")
        if state.init_routes and not state.guarded_init:
            return (False, f"expandable segments were on when the engine allocated its memory "
                           f"({', '.join(state.init_routes)}), so it landed outside the sleep pool (pytorch#147851)",
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


def check_wake(wrapped, instance, args, kwargs):
    entered = time.perf_counter()
    engine = sleep_state.engine_of(instance)
    if id(engine) in _busy():
        return wrapped(*args, **kwargs)
    tags = arg(wrapped, args, kwargs, "tags")
    probe = memory.probe()
    if sleep_ops.executor_of(engine) is None:
        result = wrapped(*args, **kwargs)
        sleep_state.note_wake(engine, tags)
        return result
    with _owning(engine):
        state = sleep_state.state_for(engine)
        name = _name(engine, state)
        do_call, pass_tags, woken = sleep_ops.plan(engine, tags)
        if not do_call:
            log.debug(f"wake {name} tags={tags}: all awake already, call skipped (vLLM would ignore it)")
            return None
        if woken and not _vllm_releases_before_wake():
            memory.release_cached(probe)
        free0 = probe.mem_get_info()[0] if probe is not None else None
        _local.guard_s = 0.0
        t0 = time.perf_counter()
        result = wrapped(pass_tags)
        t1 = time.perf_counter()
        guard_s, _local.guard_s = _local.guard_s, 0.0  # the allocator guard's own time, inside the call
        seconds = t1 - t0 - guard_s
        sleep_state.note_wake(engine, woken if tags is not None else None)
        if woken:
            state.wakes += 1
        if probe is not None and woken:
            free1, total = probe.mem_get_info()
            note = "" if pass_tags == tags else f"asked {','.join(tags)}: the others were awake"
            tracked = tracked_bytes(probe)
            shim_s = (t0 - entered) + guard_s + (time.perf_counter() - t1)
            telemetry.emit("wake", name, seconds, tags=woken, restored=max(free0 - free1, 0),
                           tracked=tracked, asleep=sorted(state.asleep), free=free1, total=total,
                           note=note, shim_s=shim_s)
        return result
