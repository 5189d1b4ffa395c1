"""The patch engine: ``Patch`` records, lazy application, decisions, rollback.

Each patch is applied by a post-import hook (``shim._hooks``) on ONE concrete upstream
module (never a package root: trl and transformers swap ``sys.modules`` entries
for lazy modules). Inside the hook, in this order: version in range (from
metadata, prereleases count), probe of the upstream shape, then ``apply`` as a
unit. Whatever happens, exactly one log line records the decision, and an
exception never escapes into the user's import -- unless SHIM_STRICT is on.
"""
from __future__ import annotations

import threading

from shim import config, log
from shim.versions import installed, in_range

APPLIED = "applied"
STAND_DOWN = "stand down"
WAITING = "waiting"
DISABLED = "disabled"
FAILED = "failed"

MARKER = "_self_shim_patch"
"""Attribute on every wrapper the shim installs: the id of its patch."""


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


class Decision:
    __slots__ = ("decision", "reason", "version")

    def __init__(self, decision: str, reason: str = "", version: "str | None" = None):
        self.decision, self.reason, self.version = decision, reason, version

    def text(self) -> str:
        return f"{self.decision}: {self.reason}" if self.reason else self.decision


class Patcher:
    """Records every change a patch makes so it can be undone in reverse order."""

    def __init__(self, patch_id: str):
        self.patch_id = patch_id
        self._undo: list = []

    def wrap(self, owner, name: str, wrapper):
        """Put ``wrapt.FunctionWrapper(original, wrapper)`` at ``owner.name``.

        ``owner`` is a class or a module. A name already wrapped by this patch
        is left alone (wrapt itself does not prevent double wrapping).
        """
        import wrapt

        current = getattr(owner, name)
        if getattr(current, MARKER, None) == self.patch_id:
            return current
        own = vars(owner).get(name, _MISSING)
        proxy = wrapt.FunctionWrapper(current if own is _MISSING else own, wrapper)
        setattr(proxy, MARKER, self.patch_id)
        self.set(owner, name, proxy)
        return proxy

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.name = value``; undo restores (or deletes) the old one."""
        own = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)

        def undo() -> None:
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

        self._undo.append(undo)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


_MISSING = object()


class _Registry:
    def __init__(self):
        self.lock = threading.RLock()
        self.active = False
        self.decisions: dict = {}
        self.patchers: dict = {}
        self.patches: dict = {}


_registry = _Registry()


def all_patches() -> list:
    from shim import registry

    return registry.all_patches()


def decisions() -> dict:
    return dict(_registry.decisions)


def _decide(patch: Patch, decision: str, reason: str = "", version: str | None = None) -> None:
    _registry.decisions[patch.id] = Decision(decision, reason, version)
    where = f"{patch.distribution} {version}" if version else patch.distribution
    line = f"{patch.id} ({patch.issue}, {where}): {Decision(decision, reason).text()}"
    if decision == FAILED:
        log.warning(line)
    elif decision != WAITING:
        log.decision(line)


def activate(patch_list: list | None = None) -> bool:
    """Register every patch's import hook. Idempotent. Raises only ConfigError."""
    with _registry.lock:
        if _registry.active:
            return True
        if config.disabled():
            log.debug(f"{config.SHIM_DISABLED} is set: shim not activated")
            return False
        patch_list = all_patches() if patch_list is None else patch_list
        config.validate([p.id for p in patch_list])
        off = config.disabled_patches([p.id for p in patch_list])
        _registry.active = True
        for patch in patch_list:
            _registry.patches[patch.id] = patch
            if patch.id in off:
                _decide(patch, DISABLED, f"listed in {config.SHIM_DISABLED_PATCHES}")
                continue
            _decide(patch, WAITING, f"{patch.module} not imported")
            _register_hook(patch)
        return True


def _register_hook(patch: Patch) -> None:
    from shim import _hooks

    _hooks.register(patch.module, lambda module: _on_import(patch, module))


def _on_import(patch: Patch, module) -> None:
    """Decide and apply; never raises unless strict. Runs once per patch."""
    with _registry.lock:
        current = _registry.decisions.get(patch.id)
        if current is not None and current.decision != WAITING:
            return
        version = installed(patch.distribution)
        patcher = Patcher(patch.id)
        try:
            if version is None:
                return _decide(patch, STAND_DOWN, f"{patch.distribution} has no installed metadata")
            if not in_range(version, patch.affected):
                fixed = patch.fixed_in and in_range(version, f">={patch.fixed_in}")
                reason = f"fixed upstream in {patch.fixed_in}" if fixed else f"version not in {patch.affected}"
                return _decide(patch, STAND_DOWN, reason, version)
            reason = patch.probe(module) if patch.probe else None
            if reason:
                return _decide(patch, STAND_DOWN, reason, version)
            patch.apply(module, patcher)
        except Exception as exc:  # roll back as a unit, keep the user's import alive
            patcher.undo()
            _decide(patch, FAILED, f"{type(exc).__name__}: {exc}", version)
            if _strict():
                raise
            return None
        _registry.patchers[patch.id] = patcher
        _decide(patch, APPLIED, "", version)


def _strict() -> bool:
    try:
        return config.strict()
    except config.ConfigError:
        return False


def remove(patch_id: str) -> bool:
    """Undo an applied patch (tests and ``shim.deactivate``). True if it was applied."""
    with _registry.lock:
        patcher = _registry.patchers.pop(patch_id, None)
        if patcher is None:
            return False
        patcher.undo()
        patch = _registry.patches[patch_id]
        _decide(patch, STAND_DOWN, "removed")
        return True


def status_rows(patch_list: list | None = None) -> list:
    """One dict per patch with the keys of ``python -m shim status --json``."""
    rows = []
    for patch in patch_list or all_patches():
        decision = _registry.decisions.get(patch.id)
        version = installed(patch.distribution)
        if decision is None:
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
