"""Probes of the upstream shape a patch expects: one message format, one place.

A probe returns None when upstream looks as the fix expects, or the reason to stand down. A
reason made with :func:`changed` (``upstream shape changed: <what>``) means the installed release
differs from every release the patch was written for: the registry logs that stand-down as a
WARNING (the user relied on the fix and must hear it), where "fixed upstream" or "version not in
range" stay one INFO decision line.
"""
from __future__ import annotations

PREFIX = "upstream shape changed: "


def changed(what: str) -> str:
    """The stand-down reason for an upstream shape the patch does not know."""
    return PREFIX + what


def is_changed(reason: "str | None") -> bool:
    return bool(reason) and reason.startswith(PREFIX)


def missing(owner, names, label: "str | None" = None, own: bool = False) -> "str | None":
    """:func:`changed` naming the attributes of ``owner`` (a class or module) that are not there, or
    None. ``own``: only the owner's own attributes count (not inherited ones)."""
    if owner is None:
        return changed(f"{label or '?'} not found")
    have = vars(owner) if own else None
    gone = [n for n in names if (n not in have if own else getattr(owner, n, None) is None)]
    if not gone:
        return None
    return changed(f"{label or getattr(owner, '__name__', owner)}.{'/'.join(gone)} not found")


def source(func, label: str) -> tuple:
    """``(source, None)`` of ``func``, or ``(None, reason)`` where it cannot be read."""
    import inspect

    try:
        return inspect.getsource(func), None
    except (OSError, TypeError) as exc:
        return None, changed(f"source of {label} not readable ({exc})")
