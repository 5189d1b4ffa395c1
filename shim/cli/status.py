"""``python -m shim status``: one row per upstream bug of the distributions installed here and what the shim
decided for it in this environment (the site that decided, where the bug has several), within 100 columns;
``--all`` every bug, ``--sites`` each bug's sites under it, ``--json`` every site for machines (with its bug id
and the bug's reference)."""
from __future__ import annotations

import importlib
import json

from shim.cli.common import fail, fitted_table, help_asked
from shim.engine import catalog, config, registry
from shim.engine.versions import installed

WIDTH = 100
"""The text view fits a terminal of this many columns (``--json`` is for machines and has every row)."""

COLUMNS = [("bug", "bug", None), ("distribution ", "distribution", 12), ("affected", "affected", 12),
           ("decision ", "decision", None)]
_RANK = ("failed", "requested, not running", "applied", "waiting", "disabled", "stand down")
"""Which site speaks for its bug: a failure first, then what acts, then what waits, then what does not."""


def status(argv: list) -> int:
    if help_asked("status", argv):
        return 0
    unknown = [a for a in argv if a not in ("--json", "--import", "--all", "--sites")]
    if unknown:
        return fail(f"status: unknown argument {unknown[0]!r} (accepted: --all, --sites, --json, --import)")
    import shim

    try:  # a bad switch: one WARNING on stderr, then the rows as the shim decides with that switch's default
        shim.activate()
    except config.ConfigError as exc:  # SHIM_STRICT=1
        return fail(str(exc))
    rows = site_rows(import_modules="--import" in argv)
    if "--json" in argv:  # every row, whatever is installed: the keys machines read
        print(json.dumps([{k: r[k] for k in KEYS} for r in rows], indent=2))
        return 0
    print(text(rows, everything="--all" in argv, sites="--sites" in argv))
    return 0


KEYS = ("id", "bug", "reference", "kind", "distribution", "installed", "affected", "decision", "reason", "acted")
"""The keys of one site's row (``--json``, :func:`shim.decisions`)."""


def site_rows(import_modules: bool = False) -> list:
    """One dict per site (every record), with the decision in this process: :data:`KEYS` and a few more.
    ``import_modules``: import each installed distribution's hooked module first (``--import``)."""
    import shim

    patches = catalog.all_patches()
    if import_modules and shim.is_active():
        for patch in patches:
            if installed(patch.distribution) is None:
                continue
            try:
                importlib.import_module(patch.module)
            except Exception as exc:  # the row says why the hook never ran
                registry.unimportable(patch, exc)
    rows = registry.status_rows(patches)
    bug_of = {row[0]: row[3] for row in catalog.index()}
    references = {bug.id: bug.reference for bug in catalog.bug_records().values()}
    for r in rows:
        r["bug"], r["reference"] = bug_of[r["id"]], references[bug_of[r["id"]]]
    from shim.verify import weights as verify

    decisions = registry.decisions()
    for r in rows:  # verification asked for but checking nothing here: say so, never just "applied"
        why = verify.not_running_reason(r["id"], decisions)
        if why:
            r["decision"], r["reason"] = "requested, not running", why
    return rows


def text(rows: list, everything: bool = False, width: int = WIDTH, sites: bool = False) -> str:
    """One line per bug of the distributions installed here (``everything``: every bug) as a table of at
    most ``width`` columns (``sites``: each site of a bug indented under it, its own decision), then one line
    counting the bugs left out and naming their distributions."""
    shown = rows if everything else [r for r in rows if r["installed"]]
    bugs: dict = {}
    for r in shown:
        bugs.setdefault(r["bug"], []).append(r)
    hidden = [] if everything else [r for r in rows if r["bug"] not in bugs]
    lines_rows = []
    for bug, its in bugs.items():
        lines_rows.append(_bug_row(bug, its))
        if sites:
            lines_rows.extend(_site_row(r) for r in its)
    lines = [fitted_table(lines_rows, COLUMNS, width)] if lines_rows else []
    if hidden:
        lines.append(_hidden_line(hidden, bool(shown), width))
    return "\n".join(lines)


def _bug_row(bug: str, sites: list) -> dict:
    """The row of ``bug``: the site that speaks for it (:data:`_RANK`), its decision, and which site that is
    where the bug has several here (``[vllm-worker-sleep-guard]``; ``[2 sites]`` when more than one applied)."""
    site = min(sites, key=lambda r: (_RANK.index(r["decision"]) if r["decision"] in _RANK else 0, -r.get("acted", 0)))
    row = _row(site, bug)
    decision = row["decision "]
    applied = [r for r in sites if r["decision"] == "applied"]
    if len(applied) > 1 and site["decision"] == "applied":
        decision += f" [{len(applied)} sites]"
    elif len(sites) > 1 and site["id"] != bug and site["decision"] not in ("stand down", "waiting"):
        decision += f" [{site['id']}]"
    row["decision "] = decision
    return row


def _site_row(site: dict) -> dict:
    """One site under its bug's row (``--sites``): ``- <site id>``, its own release and decision."""
    return _row(site, f"- {site['id']}")


def _row(site: dict, label: str) -> dict:
    """The table row of ``site`` under ``label``: its distribution with the installed release, its decision."""
    row = dict(site, bug=label)
    row["distribution "] = f"{site['distribution']} {site['installed']}" if site["installed"] else site["distribution"]
    row["decision "] = _decision(site)
    return row


def _decision(site: dict) -> str:
    """The site's decision, a reason the columns beside it already say shortened."""
    short = {f"{site['distribution']} not installed": "not installed",
             f"version not in {site['affected']}": "not affected"}.get(site["reason"] or "")
    if short and not site.get("acted"):
        return f"{site['decision']}: {short}"
    return registry.decision_text(site)


def _hidden_line(hidden: list, some_shown: bool, width: int) -> str:
    """``N more bugs for distributions not installed here (trl, ms-swift, ...): python -m shim status --all``,
    naming as many of those distributions as ``width`` allows."""
    names = list(dict.fromkeys(r["distribution"] for r in hidden))
    count = len(dict.fromkeys(r["bug"] for r in hidden))
    head = f"{count} more bugs for distributions not installed here (" if some_shown else \
        f"{count} bugs for distributions not installed here ("
    tail = "): python -m shim status --all"
    n = len(names)
    while n > 1 and len(head + ", ".join(names[:n]) + (", ..." if n < len(names) else "") + tail) > width:
        n -= 1
    return head + ", ".join(names[:n]) + (", ..." if n < len(names) else "") + tail
