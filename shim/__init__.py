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
    raises ``shim.patching.PatchFailed``, after every patch is registered.
    """
    import sys

    from shim import config, log, patching, registry

    try:
        log.setup(debug=config.debug())
        first = not patching._registry.active
        active = patching.activate(registry.entries(), registry.removed())
    except config.ConfigError as exc:
        print(f"[shim] ERROR {exc}; shim not activated", file=sys.stderr)
        return False
    except patching.PatchFailed:
        raise
    except Exception as exc:  # the shim itself is broken: say so, never break the user's program
        if patching._strict():
            raise
        print(f"[shim] ERROR activation failed: {type(exc).__name__}: {exc}; shim not activated", file=sys.stderr)
        return False
    trace = config.trace_path()
    if active and first and trace:
        from shim import telemetry

        try:
            telemetry.record_activation(trace)
        except OSError as exc:
            log.warning(f"cannot write SHIM_TRACE={trace}: {exc}")
    return active


def is_active() -> bool:
    from shim import patching

    return patching._registry.active
