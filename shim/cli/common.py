"""What the subcommands of ``python -m shim`` share: their usage texts, ``-h``, one-line failures, tables,
and the ``--trace PATH`` / ``SHIM_TRACE`` check the launcher runs before anything starts.

Each subcommand prints its usage with ``-h`` / ``--help`` (exit 0); a bad argument is one line on
stderr and exit 2.
"""
from __future__ import annotations

import os
import sys

SUBCOMMANDS = {"status": ("shim.cli.status", "status"), "doctor": ("shim.cli.doctor", "doctor"),
               "install": ("shim.cli.install", "install"), "uninstall": ("shim.cli.install", "uninstall"),
               "report": ("shim.cli.report", "report")}
"""``python -m shim <name>``: the module and function that run it (anything else is a COMMAND to launch)."""

USAGE = {
    "status": """usage: python -m shim status [--all] [--sites] [--json] [--import]

One row per upstream bug of the distributions installed here (importlib.metadata):
its id (what SHIM_DISABLED_PATCHES takes), distribution and version, affected range and
the decision in this environment (applied, stand down: <why>, waiting: <module> not
imported, disabled, failed: <why>) of the site that decided it ([site id] where the bug
has several), within 100 columns; one line counts the bugs of packages not installed.
  --all      every bug, whatever is installed
  --sites    each bug's sites (one record each: the module it hooks) under its row
  --json     every site as JSON (id, bug, reference, kind, distribution, installed,
             affected, decision, reason, acted)
  --import   import each hooked upstream module first, so every row is decided""",
    "doctor": """usage: python -m shim doctor

Prints the Python and package versions, the allocator settings (PYTORCH_*_ALLOC_CONF;
expandable segments marked) and, for each known upstream bug, whether this environment
is affected and which patch handles it. Exit 1 when an affecting bug is left unhandled
(its patch disabled) or a SHIM_* switch has a bad value, 0 otherwise.""",
    "report": """usage: python -m shim report TRACE... [--plot OUT.png]

Per-process table of SHIM_TRACE files (run, start, rank, pid, engines, sleep/wake
cycles, sleeps, GiB freed per sleep, the smallest, ineffective sleeps, seconds asleep
and awake, the shim's own ms per sleep/wake call). Processes are told apart by host,
pid and start; concurrent or successive runs in one file are numbered apart. Lines
cut by a crash or that are not trace records are skipped and counted (exit 0).
  --plot OUT.png   device memory over time, one panel per run, one colour per rank
                   (needs matplotlib; any format matplotlib writes: .png, .svg, .pdf)""",
    "install": """usage: python -m shim install

Writes vllm_sleep_shim.pth (and the PEP 829 vllm_sleep_shim.start) into this
environment's site-packages: every interpreter of the environment activates the shim.""",
    "uninstall": """usage: python -m shim uninstall

Removes the files ``install`` wrote.""",
}


def help_asked(name: str, argv: list) -> bool:
    if "-h" in argv or "--help" in argv:
        print(USAGE[name])
        return True
    return False


def fail(message: str, code: int = 2) -> int:
    print(f"shim: {message}", file=sys.stderr)
    return code


def check_trace_path(path: str, option: str = "--trace") -> tuple:
    """``(absolute path, None)`` when ``path`` (``--trace`` / ``SHIM_TRACE``) can be appended to,
    else ``(None, one line saying why)``; ``("", None)`` for an empty value (no trace).

    ``option`` names where the path came from in the message (``--trace`` or ``SHIM_TRACE``).
    Relative paths are made absolute here, against the launcher's working directory, before
    any child changes directory. Appending is tried for real (a file this creates is removed
    again), so permissions, read-only file systems and missing directories are all caught."""
    if not path or not path.strip():
        return "", None
    what = f"{option} {path}" if option.startswith("-") else f"{option}={path}"
    full = os.path.abspath(os.path.expanduser(path.strip()))
    if os.path.isdir(full):
        return None, f"{what}: is a directory; give a file path (e.g. {os.path.join(path, 'trace.jsonl')})"
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        return None, f"{what}: directory {parent} does not exist"
    existed = os.path.exists(full)
    try:
        fd = os.open(full, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        return None, f"{what}: cannot write: {exc.strerror or exc}"
    os.close(fd)
    if not existed:
        try:
            os.remove(full)
        except OSError:
            pass
    return full, None


def table(rows: list, columns: list) -> str:
    widths = [max([len(str(c))] + [len(str(r.get(c) or "-")) for r in rows]) for c in columns]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths)).rstrip()]
    for r in rows:
        lines.append("  ".join(str(r.get(c) or "-").ljust(w) for c, w in zip(columns, widths)).rstrip())
    return "\n".join(lines)


def wrap_cell(text: str, width: int) -> list:
    """``text`` in lines of at most ``width``: broken at spaces, then after commas (a version range
    ``>=0.13.0rc1,<0.26.0rc1``), a word longer than the line cut where it must."""
    lines, line = [], ""
    for word in str(text).split():
        for i, piece in enumerate(p for p in word.replace(",", ",\0").split("\0") if p):
            sep = "" if i else " "
            if line and len(line) + len(sep) + len(piece) <= width:
                line += sep + piece
                continue
            if line:
                lines.append(line)
            while len(piece) > width:
                lines.append(piece[:width])
                piece = piece[width:]
            line = piece
    if line:
        lines.append(line)
    return lines or [""]


def fitted_table(rows: list, columns: list, width: int = 100) -> str:
    """A table no wider than ``width``: ``columns`` are ``(key, header, narrowest)``; a column wider
    than its content needs shrinks to ``narrowest`` (None: never, e.g. an id a user copies) so the
    last one keeps at least 30 characters, and every cell wraps inside its column."""
    cells = [[str(r.get(key) or "-") for key, _, _ in columns] for r in rows]
    heads = [head for _, head, _ in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    room = width - 2 * (len(columns) - 1)
    excess = sum(widths[:-1]) + min(widths[-1], 30) - room
    for i, (_, _, narrowest) in enumerate(columns[:-1]):
        if excess > 0 and narrowest is not None and widths[i] > narrowest:
            cut = min(excess, widths[i] - narrowest)
            widths[i] -= cut
            excess -= cut
    widths[-1] = max(1, min(widths[-1], room - sum(widths[:-1])))
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip()]
    for row in cells:
        wrapped = [wrap_cell(c, w) for c, w in zip(row, widths)]
        for n in range(max(map(len, wrapped))):
            lines.append("  ".join((col[n] if n < len(col) else "").ljust(w)
                                   for col, w in zip(wrapped, widths)).rstrip())
    return "\n".join(lines)
