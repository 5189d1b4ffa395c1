"""vllm-sleep-shim: import-time fixes for colocated vLLM sleep mode in RL training.

``import shim.auto`` (or ``python -m shim CMD``, or ``python -m shim install``)
calls :func:`activate`, which registers one lazy hook per patch; nothing of
torch, vLLM, TRL or ms-swift is imported here.
"""
from __future__ import annotations

__version__ = "0.1.0"


def activate() -> bool:
    """Turn the shim on in this process. Idempotent; never raises (except under SHIM_STRICT=1).

    Returns True when active. A bad environment switch is reported in one line
    on stderr and leaves the shim off (the user's program still runs). Under
    SHIM_STRICT=1 a patch that failed on a module imported before this call
    raises ``shim.engine.patch.PatchFailed``, after every patch is registered.
    """
    import sys

    from shim.engine import catalog, config, log, registry
    from shim.engine.patch import PatchFailed

    try:
        log.setup(debug=config.debug())
        first = not registry._registry.active
        active = registry.activate(catalog.entries(), catalog.removed())
    except config.ConfigError as exc:
        print(f"[shim] ERROR {exc}; shim not activated", file=sys.stderr)
        return False
    except PatchFailed:
        raise
    except Exception as exc:  # the shim itself is broken: say so, never break the user's program
        if config.strict():
            raise
        print(f"[shim] ERROR activation failed: {type(exc).__name__}: {exc}; shim not activated", file=sys.stderr)
        return False
    trace = config.trace_path()
    if active and first and trace:
        from shim.observe import events

        try:
            events.record_activation(trace)
        except OSError as exc:
            log.warning(f"cannot write SHIM_TRACE={trace}: {exc}")
    return active


def is_active() -> bool:
    from shim.engine import registry

    return registry._registry.active
