"""The patch engine: ``Patch`` records, lazy application, decisions, rollback, exact removal.

The engine never imports the patches (``shim.registry`` does): :func:`activate`
gets entries (a :class:`Patch`, or an :class:`Entry` whose record is loaded when
its upstream module is imported). Each patch is applied by a post-import hook
(``shim._hooks``) on ONE concrete upstream module (never a package root: trl and
transformers swap ``sys.modules`` entries for lazy modules). Inside the hook, in
this order: version in range (from metadata, prereleases count), probe of the
upstream shape, then ``apply`` as a unit. Whatever happens, exactly one log line
records the decision, and an exception never escapes into the user's import.

``SHIM_STRICT=1`` makes a failing patch raise :class:`PatchFailed`, but only once
every patch is registered: a failure on a module imported before activation is
raised at the end of :func:`activate`, never in the middle of its loop.

Hooks, probes and ``apply`` run outside the registry's lock (a probe imports
upstream modules, and the import lock must never be taken while ours is held):
a patch is first *claimed* under the lock, so it runs once even when two
threads import its module at the same moment.
"""
from __future__ import annotations

import _thread

from shim import config, log

APPLIED = "applied"
STAND_DOWN = "stand down"
WAITING = "waiting"
DISABLED = "disabled"
FAILED = "failed"

MARKER = "_self_shim_patch"
"""Attribute on every wrapper the shim installs: the id of its patch (wrapt keeps
``_self_*`` attributes on the proxy, not on the wrapped function)."""


class PatchFailed(RuntimeError):
    """A patch failed to apply and SHIM_STRICT is on."""


class Patch:
    """One upstream bug, one fix.

    ``apply(module, patcher)`` installs the fix through ``patcher`` only, so a
    failure half-way is rolled back and ``remove`` undoes it exactly.
    ``probe(module)`` returns None when the upstream shape is the one the fix
    expects, or the reason to stand down (e.g. "fixed upstream in 1.10.0").
    """

    __slots__ = ("id", "issue", "distribution", "affected", "module", "apply", "probe", "summary", "verified",
                 "fixed_in")

    def __init__(self, id: str, issue: str, distribution: str, affected: str, module: str,
                 apply: "Callable[[ModuleType, Patcher], None]",
                 probe: "Callable[[ModuleType], str | None] | None" = None,
                 summary: str = "", verified: str = "", fixed_in: "str | None" = None):
        self.id, self.issue, self.distribution, self.affected = id, issue, distribution, affected
        self.module, self.apply, self.probe = module, apply, probe
        self.summary, self.verified, self.fixed_in = summary, verified, fixed_in

    def __repr__(self) -> str:
        return f"Patch({self.id!r}, {self.distribution} {self.affected}, {self.module})"


class Entry:
    """A registered patch: its id and hooked module, its record loaded on first use.

    ``load()`` returns the :class:`Patch` (imports its patch module). Start-up
    needs only ``id`` and ``module``; nothing of the patch is imported until the
    upstream module is."""

    __slots__ = ("id", "module", "_load", "_patch")

    def __init__(self, id: str, module: str, load):
        self.id, self.module, self._load, self._patch = id, module, load, None

    @classmethod
    def of(cls, patch: Patch) -> "Entry":
        entry = cls(patch.id, patch.module, None)
        entry._patch = patch
        return entry

    def load(self) -> Patch:
        if self._patch is None:
            patch = self._load()
            if patch.id != self.id or patch.module != self.module:
                raise RuntimeError(f"registry row ({self.id}, {self.module}) does not match its record {patch!r}")
            self._patch = patch
        return self._patch


class Decision:
    __slots__ = ("decision", "reason", "version")

    def __init__(self, decision: str, reason: str = "", version: "str | None" = None):
        self.decision, self.reason, self.version = decision, reason, version

    def text(self) -> str:
        return f"{self.decision}: {self.reason}" if self.reason else self.decision


def _chain(value):
    """``value`` and everything below it through ``__wrapped__`` (wrapt proxies, functools.wraps)."""
    seen = 0
    while value is not None and seen < 64:
        yield value
        value = getattr(value, "__wrapped__", None)
        seen += 1


def _own_marker(value):
    """The patch id on ``value`` itself. A wrapt proxy forwards unknown attributes to what it
    wraps, so a foreign proxy on top of ours would seem to carry our marker: a marker equal to
    the one below is inherited, not its own (one patch never wraps one attribute twice)."""
    marker = getattr(value, MARKER, None)
    if marker is None:
        return None
    inner = getattr(value, "__wrapped__", None)
    return None if inner is not None and getattr(inner, MARKER, None) == marker else marker


def markers(value) -> list:
    """Patch ids of the shim's wrappers stacked on ``value``, outermost first."""
    return [m for m in (_own_marker(v) for v in _chain(value)) if m is not None]


def _is_ours(value, patch_id: str) -> bool:
    return _own_marker(value) == patch_id


class Patcher:
    """Records every change a patch makes so it can be undone, exactly, in reverse order."""

    def __init__(self, patch_id: str):
        self.patch_id = patch_id
        self._undo: list = []
        self.changes: list = []
        """``(owner, name, before)`` of every attribute this patch changed, in order; ``before`` is
        the owner's own value before (``patching.MISSING`` where it had none)."""
        self.leftovers: list = []
        """What :meth:`undo` could not take out (someone else wrapped on top in a way that cannot be re-pointed)."""

    def wrap(self, owner, name: str, wrapper):
        """Put ``wrapt.FunctionWrapper(original, wrapper)`` at ``owner.name``.

        ``owner`` is a class or a module. A name this patch already wraps (anywhere
        in the stack of wrappers) is left alone: wrapt itself does not prevent
        double wrapping.
        """
        import wrapt

        current = getattr(owner, name)
        for layer in _chain(current):
            if _is_ours(layer, self.patch_id):
                return current
        own = vars(owner).get(name, _MISSING)
        proxy = wrapt.FunctionWrapper(current if own is _MISSING else own, wrapper)
        setattr(proxy, MARKER, self.patch_id)
        setattr(owner, name, proxy)
        self.changes.append((owner, name, own))
        # below our layer: what it wraps (the inherited attribute where the owner had none of its own)
        # what our layer wraps now (a stacked patch removed below us re-points it), or nothing of
        # the owner's own where it had none (the inherited attribute shows through again)
        self._undo.append(lambda: self._take_out(owner, name, proxy, _MISSING if own is _MISSING else proxy.__wrapped__,
                                                 proxy.__wrapped__))
        return proxy

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.name = value``; undo puts the old one back (or deletes it), also from under
        wrappers put on top later, and leaves a later replacement alone."""
        own = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)
        self.changes.append((owner, name, own))
        self._undo.append(lambda: self._take_out(owner, name, value, own, own))

    def _take_out(self, owner, name: str, ours, own, below) -> None:
        """Take our layer ``ours`` out of the stack at ``owner.name``, wherever it is now.

        On top: the owner gets ``own`` back (deleted where that is MISSING).
        Under another wrapper: that wrapper is re-pointed to ``below``. Gone (replaced by someone
        else): nothing of ours is left there, nothing to do."""
        top = vars(owner).get(name, _MISSING)
        if top is ours:
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)
            return
        parent = None
        for layer in _chain(None if top is _MISSING else top):
            if layer is ours:
                break
            parent = layer
        else:
            return
        where = f"{getattr(owner, '__name__', owner)}.{name}"
        if below is _MISSING:
            self.leftovers.append(where)
            return
        try:
            parent.__wrapped__ = below  # a wrapt proxy re-points: our layer drops out
        except (AttributeError, TypeError):
            self.leftovers.append(where)
            return
        if parent.__wrapped__ is not below:
            self.leftovers.append(where)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


_MISSING = MISSING = object()


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
    patch = patch or getattr(entry, "_patch", None) or (entry if isinstance(entry, Patch) else None)
    if patch is not None:
        where = f"{patch.distribution} {version}" if version else patch.distribution
        line = f"{patch.id} ({patch.issue}, {where}): {Decision(decision, reason).text()}"
    else:
        line = f"{entry.id}: {Decision(decision, reason).text()}"
    if decision == FAILED:
        log.warning(line)
    else:
        log.decision(line)


def _entry(item) -> Entry:
    return Entry.of(item) if isinstance(item, Patch) else item


def activate(items: list, known_removed: "dict | None" = None) -> bool:
    """Register every patch's import hook. Idempotent.

    ``items``: :class:`Patch` records or :class:`Entry` rows, in order. Raises
    ``ConfigError`` for a bad switch value (the caller reports it and stays off),
    and :class:`PatchFailed` under SHIM_STRICT after every patch is registered.
    An unknown id in SHIM_DISABLED_PATCHES is one WARNING; ``known_removed`` ids
    (patches deleted on schedule) are accepted silently.
    """
    with _registry.lock:
        if _registry.active:
            return True
        if config.disabled():
            _registry.off_reason = f"{config.SHIM_DISABLED}=1"
            log.debug(f"{config.SHIM_DISABLED} is set: shim not activated")
            return False
        entries = [_entry(i) for i in items]
        ids = [e.id for e in entries]
        config.validate()
        off, unknown = config.disabled_patches(ids, known_removed or ())
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
    if unknown:
        log.warning(f"{config.SHIM_DISABLED_PATCHES}: unknown patch id(s) {', '.join(unknown)} ignored; "
                    f"valid ids: {', '.join(ids)}")
    try:
        for entry, state in pending:  # outside the lock: a hook may fire at once (module already imported)
            if state == DISABLED:
                _decide(entry, DISABLED, f"listed in {config.SHIM_DISABLED_PATCHES}")
            else:
                _register_hook(entry)
    finally:
        with _registry.lock:
            deferred, _registry.deferred = _registry.deferred, None
    if deferred and _strict():
        raise deferred[0]
    return True


def _register_hook(entry: Entry) -> None:
    from shim import _hooks

    _hooks.register(entry.module, lambda module: _on_import(entry, module))


def _on_import(entry, module) -> None:
    """Decide and apply; never raises unless strict. Runs once per patch."""
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
    from shim.versions import in_range, installed

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
        if _strict():
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


def _strict() -> bool:
    try:
        return config.strict()
    except config.ConfigError:
        return False


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
    from shim.versions import installed

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
                "issue": patch.issue,
                "distribution": patch.distribution,
                "installed": version,
                "affected": patch.affected,
                "decision": decision.decision,
                "reason": decision.reason,
            }
        )
    return rows
