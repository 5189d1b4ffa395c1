"""vllm-sleep-shim: import-time fixes for colocated vLLM sleep mode in RL training.

``import shim.auto`` (or ``python -m shim CMD``, or ``python -m shim install``)
calls :func:`activate`, which registers one lazy hook per patch; nothing of
torch, vLLM, TRL or ms-swift is imported here.
"""
from __future__ import annotations

__version__ = "0.1.0"


def activate(*, reach_children: bool = True) -> bool:
    """Turn the shim on in this process, and in the Python processes it starts from now on.
    Idempotent; never raises (except under SHIM_STRICT=1).

    ``reach_children``: the bootstrap directory goes first on this process's ``PYTHONPATH``
    (``os.environ``), as ``python -m shim`` puts it there, so a process started by multiprocessing
    spawn or forkserver -- vLLM's engine core of ``AsyncLLM`` / multiprocessing ``LLM`` with
    ``VLLM_WORKER_MULTIPROC_METHOD=spawn``, the method vLLM switches to once CUDA is initialised --
    activates itself too (:func:`_reach_children`). A forked child inherits the activation anyway.
    ``python -m shim install``'s start-up line passes False: every interpreter of that environment
    activates already.

    Returns True when active. A bad environment switch is one WARNING naming it and turns off only
    what that switch controls (it reads as its default); every patch is still registered. Under
    SHIM_STRICT=1 a bad switch raises ``shim.engine.config.ConfigError`` (nothing registered), and a
    patch that failed on a module imported before this call raises ``shim.engine.patch.PatchFailed``,
    after every patch is registered.
    """
    import sys

    from shim.engine import catalog, config, log, registry
    from shim.engine.patch import PatchFailed

    try:
        config.check()  # under SHIM_STRICT=1 a bad switch raises here, before its WARNING or any other line
        log.setup(debug=config.debug())
        first = not registry.active()
        active = registry.activate(catalog.entries(), catalog.removed())
    except (config.ConfigError, PatchFailed):  # raised only under SHIM_STRICT=1: the user asked for it
        raise
    except Exception as exc:  # the shim itself is broken: say so, never break the user's program
        if config.strict():
            raise
        print(f"[shim] ERROR activation failed: {type(exc).__name__}: {exc}; shim not activated", file=sys.stderr)
        return False
    if active and reach_children:
        _reach_children()
    trace = config.trace_path()
    if active and first and trace:
        from shim.observe import events

        try:
            events.record_activation(trace)
        except OSError as exc:
            log.warning(f"cannot write SHIM_TRACE={trace}: {exc}")
    return active


def decisions() -> list:
    """What the shim decided in this process, for a training script or a callback to read or log: one dict
    per site (one hooked module and release range of a bug), the keys of ``python -m shim status --json``:
    ``id``, ``bug``, ``reference``, ``kind``, ``distribution``, ``installed``, ``affected``, ``decision``
    (``applied``, ``stand down``, ``waiting``, ``disabled``, ``failed``, ``requested, not running``),
    ``reason`` and ``acted`` (how many times its wrappers ran here). Imports every patch record (not the
    upstream modules): call it after start-up, e.g.
    ``[d["bug"] for d in shim.decisions() if d["decision"] == "applied" and d["acted"]]``."""
    from shim.cli.status import KEYS, site_rows

    return [{k: r[k] for k in KEYS} for r in site_rows()]


def bootstrap_dir() -> str:
    """The directory holding only the bootstrap ``sitecustomize.py`` (``shim/_bootstrap``)."""
    import os

    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def _reach_children() -> None:
    """The bootstrap directory first on ``os.environ["PYTHONPATH"]``, unless it is on it already
    (``python -m shim``, an earlier call); the user's entries follow unchanged (an empty value adds no
    empty entry, which would put the current directory on the children's path). The change is what
    every child started later sees (``os.environ`` writes through to the process environment);
    nothing changes for this process's own ``sys.path``. A failure is one WARNING: the user's import
    goes on and this process stays active (under SHIM_STRICT=1 it raises)."""
    import os

    from shim.engine import config, log

    try:
        here = bootstrap_dir()
        value = os.environ.get("PYTHONPATH", "")
        entries = [p for p in value.split(os.pathsep) if p]
        if any(os.path.abspath(p) == here for p in entries):
            return
        os.environ["PYTHONPATH"] = here + (os.pathsep + value if value else "")
    except Exception as exc:
        if config.strict():
            raise
        log.warning(f"child processes not reached: PYTHONPATH unchanged ({type(exc).__name__}: {exc}); "
                    f"start the program with `python -m shim` to reach spawned engine cores")


def is_active() -> bool:
    from shim.engine import registry

    return registry.active()
