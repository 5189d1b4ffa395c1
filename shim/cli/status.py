"""``python -m shim status``: one row per patch of the distributions installed here and its decision in
this environment, within 100 columns; ``--all`` every patch, ``--json`` every patch for machines."""
from __future__ import annotations

import importlib
import json

from shim.cli.common import fail, fitted_table, help_asked
from shim.engine import catalog, config, registry
from shim.engine.patch import STAND_DOWN
from shim.engine.versions import installed

WIDTH = 100
"""The text view fits a terminal of this many columns (``--json`` is for machines and has every row)."""

COLUMNS = [("id", "id", None), ("distribution ", "distribution", 12), ("affected", "affected", 12),
           ("decision ", "decision", None)]


def status(argv: list) -> int:
    if help_asked("status", argv):
        return 0
    unknown = [a for a in argv if a not in ("--json", "--import", "--all")]
    if unknown:
        return fail(f"status: unknown argument {unknown[0]!r} (accepted: --all, --json, --import)")
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
    if "--json" in argv:  # every row, whatever is installed: the keys machines read
        print(json.dumps([{k: r[k] for k in ("id", "kind", "distribution", "installed", "affected", "decision", "reason", "acted")} for r in rows], indent=2))
        return 0
    print(text(rows, everything="--all" in argv))
    return 0


def text(rows: list, everything: bool = False, width: int = WIDTH) -> str:
    """The rows of the distributions installed here (``everything``: all of them) as a table of at most
    ``width`` columns, then one line counting the rows left out and naming their distributions."""
    shown = rows if everything else [r for r in rows if r["installed"]]
    hidden = [] if everything else [r for r in rows if not r["installed"]]
    for r in shown:
        r["distribution "] = f"{r['distribution']} {r['installed']}" if r["installed"] else r["distribution"]  # + version
        r["decision "] = registry.decision_text(r)
        short = {f"{r['distribution']} not installed": "not installed",  # said by the columns beside it
                 f"version not in {r['affected']}": "not affected"}.get(r["reason"] or "")
        if short and not r.get("acted"):
            r["decision "] = f"{r['decision']}: {short}"
    lines = [fitted_table(shown, COLUMNS, width)] if shown else []
    if hidden:
        lines.append(_hidden_line(hidden, bool(shown), width))
    return "\n".join(lines)


def _hidden_line(hidden: list, some_shown: bool, width: int) -> str:
    """``N more for distributions not installed here (trl, ms-swift, ...): python -m shim status --all``,
    naming as many of those distributions as ``width`` allows."""
    names = list(dict.fromkeys(r["distribution"] for r in hidden))
    head = f"{len(hidden)} {'more' if some_shown else 'patches'} for distributions not installed here ("
    tail = "): python -m shim status --all"
    n = len(names)
    while n > 1 and len(head + ", ".join(names[:n]) + (", ..." if n < len(names) else "") + tail) > width:
        n -= 1
    return head + ", ".join(names[:n]) + (", ..." if n < len(names) else "") + tail
