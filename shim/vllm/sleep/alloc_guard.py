"""The allocator guard: expandable segments off while a sleep allocator fills its pool, the user's exact
setting back afterwards. In this package "guard" means this and nothing else.

PyTorch's ``expandable_segments:True`` makes allocations requested inside a pluggable allocator's MemPool land
outside it (pytorch#147851). vLLM's sleep mode only frees what is in its pool (``CuMemAllocator``;
vllm-ascend: ``CaMemAllocator``), so an engine built with expandable segments on frees ~0 GiB at every sleep
(ms-swift #6636). Users turn the setting on in five ways (:data:`ENV_VARS` and the live setting), each seen by
a different subset of vLLM / vllm-ascend releases; on CUDA with vLLM >= 0.31 vLLM covers every route itself
and the guard stands down (:func:`upstream_covers`). The guard is :func:`expandable_segments_off` (or
:func:`suspend` / :func:`resume`), process-wide like what it guards (``os.environ``, the live setting).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager

ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF")
"""The four env vars that turn expandable segments on; with the live setting the five routes, and which
vLLM / vllm-ascend release sees which:

=========================  =================================================
route                      seen by
=========================  =================================================
``PYTORCH_CUDA_ALLOC_CONF``  vLLM <= 0.20.0: assert in ``CuMemAllocator()``;
                           0.20.1 - 0.32.x: toggled off inside
                           ``use_memory_pool`` (the ONLY route it reads)
``PYTORCH_ALLOC_CONF``       vLLM >= 0.31 only
``PYTORCH_HIP_ALLOC_CONF``   vLLM >= 0.31 only (ROCm)
live setting               vLLM >= 0.31 only (``torch.cuda.memory.
(``_set_allocator_settings``)  _set_allocator_settings``; torch_npu's)
``PYTORCH_NPU_ALLOC_CONF``   vllm-ascend, every release: ``CaMemAllocator()``
                           asserts on the ENV STRING and never toggles; a live
                           setting or an env var rewritten after torch_npu
                           initialised passes the assert and still bypasses
=========================  =================================================

So: vLLM < 0.31 on CUDA/ROCm needs the ``PYTORCH_ALLOC_CONF`` / HIP / live part
(on torch builds that bypass; torch 2.11 + vLLM 0.24 was measured not to), vLLM
<= 0.20.0 also needs the ``PYTORCH_CUDA_ALLOC_CONF`` rewrite to pass its
assert, and every vllm-ascend needs both the ``PYTORCH_NPU_ALLOC_CONF``
rewrite (its assert) and the live setting off (the actual bypass)."""
KEY = "expandable_segments"

_lock = threading.RLock()
_depth = 0
_token = None
_tracked: dict = {}      # device name -> bool: last live value set through the tracked setter
_ours = threading.local()
TRACK_MARKER = "_shim_tracks_allocator_settings"


def conf_expandable(value: "str | None") -> bool:
    """True when the config string turns expandable segments on (last occurrence wins)."""
    on = False
    for item in (value or "").split(","):
        key, _, val = item.partition(":")
        if key.strip() == KEY:
            on = val.strip().lower() == "true"
    return on


def conf_without_expandable(value: str) -> str:
    """The same string with only the expandable_segments item(s) set to False."""
    items = value.split(",")
    out = [f"{KEY}:False" if item.partition(":")[0].strip() == KEY else item for item in items]
    return ",".join(out)


_covered: dict = {}      # device name -> the reason vLLM covers every route there, or None (read once)


def upstream_covers(probe) -> "str | None":
    """Why the guard has nothing to do on ``probe``'s device, or None: on CUDA/ROCm, a vLLM whose
    ``vllm.device_allocator.alloc_conf`` (0.31+) rewrites the allocator config around its sleep pool.

    vLLM >= 0.31 on CUDA/ROCm needs nothing, and the guard there would do harm: vLLM's
    ``use_memory_pool`` reads the live config (else the three env vars) and rewrites the
    WHOLE string with only ``expandable_segments`` flipped (``device_allocator/alloc_conf.py``,
    0.31.0 = 0.33.0 = 0.34.0; ``cumem.py`` 0.31.0:387-390 / 0.33.0:391-394 / 0.34.0:418-421), because torch's
    ``parseArgs`` resets ``max_split_size_mb``, ``roundup_power2_divisions`` and
    ``garbage_collection_threshold`` whenever a string leaves them out (c10
    ``AllocatorConfig.cpp``) -- which the guard's bare ``expandable_segments:False`` /
    ``:True`` live write does, dropping the user's values for the rest of the process.
    This tells that case (vLLM's ``alloc_conf`` module importable, the device CUDA): the guard
    records stand down there (fixed upstream), :func:`suspend` leaves every route alone and
    :func:`routes_on` reports none (expandable segments on are no risk to the pool). The NPU part
    is unchanged: vllm-ascend still only asserts.
    """
    if probe is None or probe.name != "cuda":
        return None
    if probe.name not in _covered:
        try:
            from vllm.device_allocator import alloc_conf
        except Exception:  # no vLLM, or one before 0.31
            alloc_conf = None
        ok = alloc_conf is not None and all(
            callable(getattr(alloc_conf, name, None)) for name in ("current_alloc_conf", "with_conf_flag", "set_alloc_conf"))
        _covered[probe.name] = (
            "fixed upstream: vLLM turns expandable segments off itself on every route (PYTORCH_ALLOC_CONF, "
            "PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF, the live setting) and keeps the user's other "
            "allocator options (vllm.device_allocator.alloc_conf, vLLM 0.31+)") if ok else None
    return _covered[probe.name]


def env_routes() -> dict:
    """The env vars that turn expandable segments on now: ``{name: value}``."""
    return {n: os.environ[n] for n in ENV_VARS if n in os.environ and conf_expandable(os.environ[n])}


def _setter_owner(probe):
    return getattr(probe.module, "memory", None) if probe is not None else None


def track_live_setting(probe, patcher=None) -> bool:
    """Record every later ``<device>.memory._set_allocator_settings`` call (``patcher``
    undoes it). True when tracking is in place."""
    owner = _setter_owner(probe)
    setter = getattr(owner, "_set_allocator_settings", None)
    if setter is None:
        return False
    if getattr(setter, TRACK_MARKER, False):
        return True
    name = probe.name

    def _set_allocator_settings(setting, *args, **kwargs):
        result = setter(setting, *args, **kwargs)
        if not getattr(_ours, "active", False) and isinstance(setting, str) and KEY in setting:
            _tracked[name] = conf_expandable(setting)
        return result

    setattr(_set_allocator_settings, TRACK_MARKER, True)
    _set_allocator_settings.__wrapped__ = setter
    if patcher is not None:
        patcher.set(owner, "_set_allocator_settings", _set_allocator_settings)
    else:
        setattr(owner, "_set_allocator_settings", _set_allocator_settings)
    return True


def _reported_setting(probe) -> "str | None":
    owner = _setter_owner(probe)
    getter = getattr(owner, "_get_allocator_settings", None)
    if getter is None and probe.name == "cuda":
        import torch

        getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is None:
        return None
    try:
        value = getter()
    except Exception:
        return None
    return value if isinstance(value, str) else None


_reported: dict = {}      # device name -> bool | None: the allocator's report, read once


def live_expandable(probe) -> "bool | None":
    """The live setting as far as it can be known (None: unknown).

    The live setting cannot be read on every torch: the guard believes, in this
    order, the last value set through the device's ``memory._set_allocator_settings``
    since the shim tracked it (:func:`track_live_setting`), the allocator's own
    report (``memory._get_allocator_settings`` where present, else
    ``torch._C._accelerator_getAllocatorSettings`` on CUDA; read once per device),
    then the env vars.

    The allocator's report is read once per device (a C++ round trip of ~0.05-0.2 ms,
    on every wake otherwise): later changes go through the tracked setter, which wins.
    """
    if probe is None:
        return None
    if probe.name in _tracked:
        return _tracked[probe.name]
    if probe.name not in _reported:
        reported = _reported_setting(probe)
        _reported[probe.name] = conf_expandable(reported) if reported is not None and KEY in reported else None
    return _reported[probe.name]


def routes_on(probe) -> list:
    """Names of the routes that turn expandable segments on now (env vars, then "live setting"); none where
    vLLM turns them off itself around its pool (:func:`upstream_covers`)."""
    if upstream_covers(probe):
        return []
    routes = list(env_routes())
    if live_expandable(probe):
        routes.append("live setting")
    return routes


def expandable_anywhere(probe=None) -> bool:
    """Expandable segments are (or may be) on through any route right now."""
    return bool(env_routes()) or bool(live_expandable(probe))


class _Token:
    __slots__ = ("env", "live_off", "saw")

    def __init__(self, env: dict, live_off: bool, saw: list):
        self.env, self.live_off, self.saw = env, live_off, saw


def _set_live(probe, on: bool) -> None:
    import warnings

    _ours.active = True
    try:
        with warnings.catch_warnings():  # torch >= 2.9 deprecates the cuda alias
            warnings.simplefilter("ignore", FutureWarning)
            probe.set_allocator_settings(f"{KEY}:{on}")
    finally:
        _ours.active = False


def _enter(probe) -> _Token:
    """Off on every route; on any failure (an interrupt included) the env strings are put
    back before the exception leaves, so a failed suspend leaves nothing suspended. Nothing
    at all where vLLM does it itself (:func:`upstream_covers`)."""
    if upstream_covers(probe):
        return _Token({}, False, [])
    saved = env_routes()
    try:
        for name, value in saved.items():
            os.environ[name] = conf_without_expandable(value)
        live = live_expandable(probe)
        live_off = probe is not None and (live is True or (live is None and bool(saved)))
        if live_off:
            _set_live(probe, False)
    except BaseException:
        for name, value in saved.items():
            os.environ[name] = value
        raise
    saw = list(saved) + (["live setting"] if live else [])
    return _Token(saved, live_off, saw)


def _exit(token: _Token, probe) -> None:
    """The user's exact setting back. Never raises: it runs in ``finally`` blocks around
    upstream calls, whose own exception must reach the caller unchanged; a live setting
    that cannot be put back is one WARNING."""
    for name, value in token.env.items():
        os.environ[name] = value
    if token.live_off:
        try:
            _set_live(probe, True)
        except Exception as exc:
            from shim.engine import log

            log.warning(f"allocator guard: could not turn expandable segments back on in the live allocator "
                        f"setting ({type(exc).__name__}: {exc}); the env vars are back")


def suspend(probe=None) -> "_Token | None":
    """Turn expandable segments off (re-entrant); pass the result to :func:`resume`.

    :func:`suspend` / :func:`resume` are :func:`expandable_segments_off` as two calls (for code
    shaped like ms-swift's ``set_expandable_segments(False)`` ... ``set_expandable_segments(True)``).
    The nesting depth is process-wide (a module global, under a lock) because what
    it guards is: ``os.environ`` and the allocator's live setting belong to the
    process, and the guard is entered from several patches (``vllm-sleep-guard``
    around a build or wake, ms-swift's ``set_expandable_segments`` pair around a
    rollout), in any order. Nothing else passes between patches through it.
    """
    global _depth, _token
    with _lock:
        _depth += 1
        if _depth == 1:
            try:
                _token = _enter(probe)
            except BaseException:
                _depth -= 1
                raise
            _token_probe[0] = probe
        return _token


_token_probe: list = [None]


def resume(token=None) -> None:
    """Undo one :func:`suspend`; the outermost one restores the user's setting."""
    global _depth, _token
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0 and _token is not None:
            tok, _token = _token, None
            _exit(tok, _token_probe[0])


def routes_seen() -> list:
    """Routes the outermost active guard found on (empty outside a guard)."""
    with _lock:
        return list(_token.saw) if _token is not None else []


@contextmanager
def expandable_segments_off(probe=None):
    """Expandable segments off inside, the user's exact setting back outside.

    A re-entrant context manager: on entry each of the four env vars that enables expandable
    segments is rewritten with only that key set to ``False`` (other keys kept, order kept), and
    the live setting is switched off when it is (or may be) on; on exit the env strings are put
    back exactly and the live setting back on.
    """
    token = suspend(probe)
    try:
        yield token
    finally:
        resume(token)
