"""The ``Patch`` record (one site of an upstream bug), the registry's ``Entry`` row and a ``Decision``.

A record says what it fixes (``issue``, ``distribution``, ``affected``, ``fixed_in``), what it is
(``kind``: :data:`FIX` for an upstream bug, :data:`FEATURE` for something the shim adds, :data:`CHECK`
for a check that reports and changes nothing), how it is applied (``module``, ``apply``, ``probe``)
and, for a feature that needs turning on, its ``switch`` (an environment variable); where the
generated contract tests it (``tested_at``: the test environment kind and release,
e.g. ``("trl", "1.9.2")``); what it changes (``summary``; in full: ``changes``) and how that was
verified (``verified``). Its bug (``patches/bugs.py``) is named by its ``INDEX`` row. ``python -m shim status``,
``doctor`` and the generated docs/bugs.md and docs/patches.md (``python -m shim.cli.table``) read these records.
"""
from __future__ import annotations

TYPE_CHECKING = False  # not ``from typing import TYPE_CHECKING``: typing (and re, collections) at start-up
if TYPE_CHECKING:  # annotations only; type checkers read the name as True
    from types import ModuleType
    from typing import Callable

    from shim.engine.patcher import Patcher

APPLIED = "applied"
STAND_DOWN = "stand down"
WAITING = "waiting"
DISABLED = "disabled"
FAILED = "failed"

FIX, FEATURE, CHECK = "fix", "feature", "check"
KINDS = (FIX, FEATURE, CHECK)


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
                 "fixed_in", "kind", "tested_at", "switch", "changes")

    def __init__(self, id: str, issue: str, distribution: str, affected: str, module: str,
                 apply: "Callable[[ModuleType, Patcher], None]",
                 probe: "Callable[[ModuleType], str | None] | None" = None,
                 summary: str = "", verified: str = "", fixed_in: "str | None" = None, kind: str = FIX,
                 tested_at: "tuple | None" = None, switch: "str | None" = None, changes: str = ""):
        if kind not in KINDS:
            raise ValueError(f"Patch {id!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
        self.id, self.issue, self.distribution, self.affected = id, issue, distribution, affected
        self.module, self.apply, self.probe = module, apply, probe
        self.summary, self.verified, self.fixed_in = summary, verified, fixed_in
        self.kind, self.tested_at = kind, tuple(tested_at) if tested_at else None
        self.switch = switch
        """The environment switch a feature needs on (e.g. ``SHIM_VERIFY_WEIGHTS``), or None."""
        self.changes = changes
        """What the shim changes at this site, in full (docs/patches.md); "" where ``summary`` says it all.
        ``verified``: how it was verified (the tests and runs behind each claim), in full."""

    def like(self, **changes) -> "Patch":
        """Another site of the same bug: this record with ``changes`` (its id, module, range, ``tested_at``, ...)."""
        fields = {name: getattr(self, name) for name in Patch.__slots__}
        fields.update(changes)
        return Patch(**fields)

    def __repr__(self) -> str:
        return f"Patch({self.id!r}, {self.distribution} {self.affected}, {self.module})"


class Entry:
    """A registered patch (one site of a bug): its id, hooked module and bug id, its record loaded on first use.

    ``load()`` returns the :class:`Patch` (imports its patch module). Start-up
    needs only ``id`` and ``module``; nothing of the patch is imported until the
    upstream module is."""

    __slots__ = ("id", "module", "bug", "_load", "_patch")

    def __init__(self, id: str, module: str, load, bug: "str | None" = None):
        self.id, self.module, self._load, self._patch = id, module, load, None
        self.bug = bug or id
        """The upstream bug this site fixes (``patches/__init__.py`` INDEX, fourth column)."""

    @classmethod
    def of(cls, patch: Patch) -> "Entry":
        entry = cls(patch.id, patch.module, None)
        entry._patch = patch
        return entry

    @property
    def loaded(self) -> "Patch | None":
        """The record when it is loaded already, else None (never imports the patch module)."""
        return self._patch

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
