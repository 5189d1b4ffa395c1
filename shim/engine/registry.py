"""Activation and decisions: lazy application of the patches, rollback, exact removal, status rows.

The engine never imports the patches (``shim.engine.catalog`` does): :func:`activate` gets entries (a
:class:`Patch`, or an :class:`Entry` whose record is loaded when its upstream module is imported). Each patch is
applied by a post-import hook (``shim.engine.hooks``) on ONE concrete upstream module, never a package root:
trl and transformers swap ``sys.modules`` entries for lazy modules. Whatever happens, exactly one log line
records the decision, and an exception never escapes into the user's import.
"""
from __future__ import annotations

import _thread

from shim.engine import config, log, probes
from shim.engine.patch import APPLIED, DISABLED, FAILED, STAND_DOWN, WAITING, Decision, Entry, Patch, PatchFailed
from shim.engine.patcher import Patcher, acted


class _Registry:
    def __init__(self):
        self.lock = _thread.RLock()
        self.active = False
        self.off_reason = ""
        self.decisions: dict = {}
        self.patchers: dict = {}
        self.entries: dict = {}
        self.claimed: set = set()
        self.deferred: "list | None" = None  # strict failures while activate() registers


_registry = _Registry()


def decisions() -> dict:
    return dict(_registry.decisions)


def entries() -> list:
    return list(_registry.entries.values())


def _decide(entry, decision: str, reason: str = "", version: "str | None" = None, patch: "Patch | None" = None) -> None:
    with _registry.lock:
        _registry.decisions[entry.id] = Decision(decision, reason, version)
    if decision == WAITING:
        return
    patch = patch or getattr(entry, "loaded", None) or (entry if isinstance(entry, Patch) else None)
    if patch is not None:
        where = f"{patch.distribution} {version}" if version else patch.distribution
        line = f"{patch.id} ({patch.issue}, {where}): {Decision(decision, reason).text()}"
    else:
        line = f"{entry.id}: {Decision(decision, reason).text()}"
    if decision == FAILED or (decision == STAND_DOWN and probes.is_changed(reason)):
        log.warning(line)  # the user relied on the fix: an unknown upstream shape is heard, not just INFO
    else:
        log.decision(line)


def _entry(item) -> Entry:
    return Entry.of(item) if isinstance(item, Patch) else item


def activate(items: list, known_removed: "dict | None" = None) -> bool:
    """Register every patch's import hook. Idempotent.

    ``items``: :class:`Patch` records or :class:`Entry` rows, in order. A bad switch value is one
    WARNING and that switch's default (every patch still registers); under SHIM_STRICT it raises
    ``ConfigError`` before anything is registered, and :class:`PatchFailed` after every patch is.
    An unknown id in SHIM_DISABLED_PATCHES is one WARNING; ``known_removed`` ids
    (patches deleted on schedule) are accepted silently.

    ``SHIM_STRICT=1`` makes a failing patch raise :class:`PatchFailed`, but only once every patch is
    registered: a failure on a module imported before activation is raised at the end, never in the
    middle of the loop.
    """
    with _registry.lock:
        if _registry.active:
            return True
        config.check()  # a bad switch: one WARNING, its default; ConfigError only under SHIM_STRICT
        if config.disabled():
            _registry.off_reason = f"{config.SHIM_DISABLED}=1"
            log.debug(f"{config.SHIM_DISABLED} is set: shim not activated")
            return False
        entries = [_entry(i) for i in items]
        ids = [e.id for e in entries]
        bugs: dict = {}
        for e in entries:
            bugs.setdefault(e.bug, []).append(e.id)
        off, unknown = config.disabled_patches(ids, known_removed or (), bugs)
        aliases = config.site_aliases(bugs)
        listed = config.disabled_items()
        _registry.active = True
        _registry.off_reason = ""
        _registry.deferred = []
        pending = []
        for entry in entries:
            _registry.entries[entry.id] = entry
            if entry.id in off:
                pending.append((entry, DISABLED))
            else:
                _registry.decisions[entry.id] = Decision(WAITING, f"{entry.module} not imported")
                pending.append((entry, WAITING))
    for site, bug in aliases:  # a site id keeps working alone; the user hears how to turn the whole bug off
        log.decision(f"{config.SHIM_DISABLED_PATCHES}: {site} is one site of bug {bug}; {bug} turns off all "
                     f"{len(bugs[bug])} ({', '.join(bugs[bug])})")
    if unknown:  # the launcher warned already before COMMAND started: once per run, not once per process
        warn = log.debug if config.unknown_patches_reported() else log.warning
        warn(config.unknown_patches_warning(unknown, list(dict.fromkeys([*bugs, *ids]))))
    try:
        for entry, state in pending:  # outside the lock: a hook may fire at once (module already imported)
            if state == DISABLED:
                via = f"its bug {entry.bug} " if entry.id not in listed and entry.bug in listed else ""
                _decide(entry, DISABLED, f"{via}listed in {config.SHIM_DISABLED_PATCHES}")
            else:
                _register_hook(entry)
    finally:
        with _registry.lock:
            deferred, _registry.deferred = _registry.deferred, None
    if deferred and config.strict():
        raise deferred[0]
    return True


def _register_hook(entry: Entry) -> None:
    from shim.engine import hooks

    hooks.register(entry.module, lambda module: _on_import(entry, module))


def _on_import(entry, module) -> None:
    """Decide and apply; never raises unless strict. Runs once per patch.

    In this order: version in range (from metadata, prereleases count), probe of the upstream shape,
    then ``apply`` as a unit. Hooks, probes and ``apply`` run outside the registry's lock (a probe
    imports upstream modules, and the import lock must never be taken while ours is held): a patch is
    first *claimed* under the lock, so it runs once even when two threads import its module at once.
    """
    entry = _entry(entry)
    with _registry.lock:
        current = _registry.decisions.get(entry.id)
        if (current is not None and current.decision != WAITING) or entry.id in _registry.claimed:
            return
        _registry.claimed.add(entry.id)
    try:
        _apply(entry, module)
    finally:
        with _registry.lock:
            _registry.claimed.discard(entry.id)


def _apply(entry: Entry, module) -> None:
    from shim.engine.versions import in_range, installed

    patcher = Patcher(entry.id)
    version = patch = None
    try:
        patch = entry.load()
        version = installed(patch.distribution)
        if version is None:
            return _decide(entry, STAND_DOWN, f"{patch.distribution} has no installed metadata", patch=patch)
        if not in_range(version, patch.affected):
            fixed = patch.fixed_in and in_range(version, f">={patch.fixed_in}")
            reason = f"fixed upstream in {patch.fixed_in}" if fixed else f"version not in {patch.affected}"
            return _decide(entry, STAND_DOWN, reason, version, patch)
        reason = patch.probe(module) if patch.probe else None
        if reason:
            return _decide(entry, STAND_DOWN, reason, version, patch)
        patch.apply(module, patcher)
    except Exception as exc:  # roll back as a unit, keep the user's import alive
        try:
            patcher.undo()
        except Exception as undo_exc:  # never let a failing rollback out either
            exc = RuntimeError(f"{type(exc).__name__}: {exc}; rollback: {type(undo_exc).__name__}: {undo_exc}")
        _decide(entry, FAILED, f"{type(exc).__name__}: {exc}", version, patch)
        if config.strict():
            failure = PatchFailed(f"{entry.id}: {type(exc).__name__}: {exc}")
            failure.__cause__ = exc
            with _registry.lock:
                deferred = _registry.deferred
                if deferred is not None:
                    deferred.append(failure)
                    return None
            raise failure
        return None
    with _registry.lock:
        _registry.patchers[entry.id] = patcher
    _decide(entry, APPLIED, "", version, patch)



def changes(patch_id: str) -> list:
    """``(owner, name, before)`` an applied patch changed (empty when not applied)."""
    patcher = _registry.patchers.get(patch_id)
    return list(patcher.changes) if patcher else []


def remove(patch_id: str) -> bool:
    """Undo an applied patch: only its own wrappers, wherever they sit in a stack.

    True if it was applied and is now fully removed. Where another layer on top
    cannot be re-pointed, the patch stays recorded as applied (``status`` keeps
    telling the truth) and one WARNING names the attribute."""
    with _registry.lock:
        patcher = _registry.patchers.pop(patch_id, None)
    if patcher is None:
        return False
    patcher.undo()
    entry = _registry.entries.get(patch_id) or Entry(patch_id, "?", None)
    if patcher.leftovers:
        with _registry.lock:
            _registry.patchers[patch_id] = patcher
        log.warning(f"{patch_id}: cannot remove its wrapper from {', '.join(patcher.leftovers)} "
                    f"(wrapped again by something that cannot be re-pointed); still applied there")
        return False
    previous = _registry.decisions.get(patch_id)
    _decide(entry, STAND_DOWN, "removed", previous.version if previous else None)
    return True


def status_rows(items: list) -> list:
    """One dict per patch with the keys of ``python -m shim status --json``."""
    from shim.engine.versions import installed

    rows = []
    for item in items:
        patch = item if isinstance(item, Patch) else _entry(item).load()
        decision = _registry.decisions.get(patch.id)
        version = installed(patch.distribution)
        if decision is None:
            if _registry.off_reason:
                decision = Decision(DISABLED, _registry.off_reason)
            else:
                decision = Decision(WAITING, "shim not activated in this process")
        elif decision.decision == WAITING and version is None:
            decision = Decision(STAND_DOWN, f"{patch.distribution} not installed")
        rows.append(
            {
                "id": patch.id,
                "kind": patch.kind,
                "issue": patch.issue,
                "distribution": patch.distribution,
                "installed": version,
                "affected": patch.affected,
                "decision": decision.decision,
                "reason": decision.reason,
                "acted": acted.get(patch.id, 0) if decision.decision == APPLIED else 0,
            }
        )
    return rows


def decision_text(row: dict) -> str:
    """``applied``, ``applied, acted N times`` (its wrappers ran in this process), or ``<decision>: <why>``."""
    text = f"{row['decision']}: {row['reason']}" if row["reason"] else row["decision"]
    if row.get("acted"):
        text += f", acted {row['acted']} time{'s' if row['acted'] != 1 else ''}"
    return text


def unimportable(patch: Patch, exc: BaseException) -> None:
    """``status --import``: the hooked module of ``patch`` cannot be imported, so its hook never runs; say why."""
    _decide(patch, STAND_DOWN, f"cannot import {patch.module}: {type(exc).__name__}: {exc}")
