"""Probes of the upstream shape a patch expects: one message format, one place.

A probe returns None when upstream looks as the fix expects, or the reason to stand down. A
reason made with :func:`changed` (``upstream shape changed: <what>``) means the installed release
differs from every release the patch was written for: the registry logs that stand-down as a
WARNING (the user relied on the fix and must hear it), where "fixed upstream" or "version not in
range" stay one INFO decision line. A dependency that is not importable here (TRL without vLLM:
``if is_vllm_available(): from vllm import LLM`` leaves ``LLM`` out) is no shape change: a probe asks
:func:`unimportable` before it looks for the names that dependency provides, and stands down with
that plain reason (INFO).
"""
from __future__ import annotations

PREFIX = "upstream shape changed: "


def changed(what: str) -> str:
    """The stand-down reason for an upstream shape the patch does not know."""
    return PREFIX + what


def is_changed(reason: "str | None") -> bool:
    return bool(reason) and reason.startswith(PREFIX)


def unimportable(*names: str) -> "str | None":
    """``"<name> not importable (...)"`` for the first of the modules ``names`` that cannot be imported in
    this process (not installed, blocked, or its finder fails), else None. Reads ``sys.modules`` and the
    finders only: nothing is imported. A module that is installed but was not imported by the upstream
    module is None here: the probe's own shape check decides (that may be a real change upstream)."""
    import importlib.util
    import sys

    for name in names:
        if sys.modules.get(name) is not None:
            continue
        if name in sys.modules:  # None: imports of it are blocked
            return f"{name} not importable (blocked: sys.modules[{name!r}] is None)"
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            return f"{name} not importable ({type(exc).__name__}: {exc})"
        if spec is None:
            return f"{name} not importable (not installed)"
    return None


def missing(owner, names, label: "str | None" = None, own: bool = False, needs: tuple = ()) -> "str | None":
    """:func:`changed` naming the attributes of ``owner`` (a class or module) that are not there, or
    None. ``own``: only the owner's own attributes count (not inherited ones). ``needs``: modules the
    names come from (``("vllm",)``); one of them not importable is that plain reason instead."""
    if owner is None:
        return unimportable(*needs) or changed(f"{label or '?'} not found")
    have = vars(owner) if own else None
    gone = [n for n in names if (n not in have if own else getattr(owner, n, None) is None)]
    if not gone:
        return None
    return unimportable(*needs) or changed(f"{label or getattr(owner, '__name__', owner)}.{'/'.join(gone)} not found")


def method(cls, name: str, own: bool = False):
    """The attribute ``name`` of ``cls`` (a method, as upstream defines it), or None (also where ``cls`` is None).
    ``own``: only one the class itself defines, not one it inherits (a subclass's own override is the
    code the patch was written for)."""
    if cls is None:
        return None
    return vars(cls).get(name) if own else getattr(cls, name, None)


def source(func, label: str) -> tuple:
    """``(source, None)`` of ``func``, or ``(None, reason)`` where it cannot be read: a :func:`changed` reason
    (stand down), never an exception (a zipped or compiled-only install, a class built at run time)."""
    import inspect

    try:
        return inspect.getsource(func), None
    except (OSError, TypeError) as exc:
        return None, changed(f"source of {label} not readable ({exc})")


def params(func, label: str) -> tuple:
    """``(parameter names, None)`` of ``func``, or ``(None, reason)`` where it has no signature (a
    :func:`changed` reason)."""
    import inspect

    try:
        return list(inspect.signature(func).parameters), None
    except (TypeError, ValueError) as exc:
        return None, changed(f"{label} has no signature ({exc})")


def fixed_if_contains(func, label: str, needles, fixed: str) -> "str | None":
    """``fixed`` (the stand-down reason) where the source of ``func`` contains one of ``needles`` (a string or
    several): upstream has the fix; a :func:`changed` reason where it cannot be read; else None."""
    text, reason = source(func, label)
    if reason:
        return reason
    needles = (needles,) if isinstance(needles, str) else needles
    return fixed if any(needle in text for needle in needles) else None
