"""``python -m shim report TRACE... [--plot OUT.png]``: per-process table of SHIM_TRACE recordings.

With weight checks (``SHIM_VERIFY_WEIGHTS``) in the trace: how many, verified / partly verified / stale, the
lowest verified share of the engine's bytes, and per engine the tensors left out with their reasons."""
from __future__ import annotations

import os
import sys

from shim.cli.common import fail, help_asked, table


def report(argv: list) -> int:
    """``report TRACE... [--plot OUT.png]``: per-process table of SHIM_TRACE recordings."""
    if help_asked("report", argv):
        return 0
    from shim.observe import plot, tracefile

    paths, out = [], None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--plot":
            if i + 1 >= len(argv):
                return fail("report: --plot needs an output path (e.g. --plot memory.png)")
            out = argv[i + 1]
            i += 2
            continue
        if a.startswith("-"):
            return fail(f"report: unknown option {a!r} (accepted: --plot OUT.png, --help)")
        paths.append(a)
        i += 1
    if not paths:
        return fail("report: give one or more trace files (written with SHIM_TRACE=PATH)")
    try:
        trace = tracefile.read(paths)
    except tracefile.TraceError as exc:
        return fail(f"report: {exc}", 1)
    if trace.skipped:
        shown = "; ".join(trace.skipped[:3]) + ("; ..." if len(trace.skipped) > 3 else "")
        print(f"shim: report: skipped {len(trace.skipped)} line(s) that are not whole trace records ({shown})",
              file=sys.stderr)
    if not trace.records:
        return fail(f"report: no events in {', '.join(paths)}", 1)
    rows = tracefile.rows(trace)
    columns = ["run", "start", "rank", "pid"] + (["host"] if any("host" in r for r in rows) else []) + [
        "engines", "cycles", "sleeps", "GiB freed/sleep", "min GiB freed", "ineffective", "asleep s", "awake s",
        "shim ms/call"]
    if any(r["weight checks"] != "-" for r in rows):  # SHIM_VERIFY_WEIGHTS: the checks and their share
        columns += tracefile.VERIFY_COLUMNS
    print(table([{k: str(v) for k, v in r.items()} for r in rows], columns))
    for line in tracefile.skipped(trace):
        print(f"weights: {line}")
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return fail("report: --plot needs matplotlib (pip install matplotlib); the table above is complete", 1)
        if os.path.isdir(out):
            return fail(f"report: cannot write the plot to {out}: is a directory; the table above is complete", 1)
        try:
            plot.plot(trace, out)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            return fail(f"report: cannot write the plot to {out}: {why}; the table above is complete", 1)
        # matplotlib adds its default format's suffix to a name without one
        suffix = "" if os.path.splitext(out)[1] else "." + str(matplotlib.rcParams.get("savefig.format", "png"))
        print(f"shim: wrote {out}{suffix}")
    return 0

