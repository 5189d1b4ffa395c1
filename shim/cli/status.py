"""``python -m shim status``: one row per patch and its decision in this environment."""
from __future__ import annotations

import importlib
import json

from shim.cli.common import fail, help_asked, table
from shim.engine import catalog, config, registry
from shim.engine.patch import STAND_DOWN
from shim.engine.versions import installed


def status(argv: list) -> int:
    if help_asked("status", argv):
        return 0
    unknown = [a for a in argv if a not in ("--json", "--import")]
    if unknown:
        return fail(f"status: unknown argument {unknown[0]!r} (accepted: --json, --import)")
    import shim

    try:  # a bad switch: one WARNING on stderr, then the rows as the shim decides with that switch's default
        shim.activate()
    except config.ConfigError as exc:  # SHIM_STRICT=1
        return fail(str(exc))
    patches = catalog.all_patches()
    if "--import" in argv and shim.is_active():
        for patch in patches:
            if installed(patch.distribution) is None:
                continue
            try:
                importlib.import_module(patch.module)
            except Exception as exc:  # the row says why the hook never ran
                registry._decide(patch, STAND_DOWN, f"cannot import {patch.module}: {type(exc).__name__}: {exc}")
    rows = registry.status_rows(patches)
    from shim.verify import weights as verify

    decisions = registry.decisions()
    for r in rows:  # verification asked for but checking nothing here: say so, never just "applied"
        why = verify.not_running_reason(r["id"], decisions)
        if why:
            r["decision"], r["reason"] = "requested, not running", why
    if "--json" in argv:
        print(json.dumps([{k: r[k] for k in ("id", "kind", "distribution", "installed", "affected", "decision", "reason", "acted")} for r in rows], indent=2))
        return 0
    for r in rows:
        r["decision "] = registry.decision_text(r)
    print(table(rows, ["id", "issue", "distribution", "installed", "affected", "decision "]))
    return 0
