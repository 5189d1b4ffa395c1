"""Reading SHIM_TRACE files back: records, processes, runs and the rows of ``python -m shim report``.

``python -m shim report`` reads trace files back (:func:`read`): lines cut by a
crash or that are not trace records are skipped and counted; each process is
told apart by host, pid and start, and processes are grouped into runs
(:func:`runs`), so two runs in one file are never merged into one rank 0.
"""
from __future__ import annotations

import json
import time

from shim.observe.events import GiB


class TraceError(ValueError):
    """A trace file that cannot be read."""


class Trace:
    """What :func:`read` found: ``records`` (engine events, by time), ``activations``
    (``activate`` records) and ``skipped`` (``"path:line: why"`` per line left out)."""

    __slots__ = ("records", "activations", "skipped")

    def __init__(self):
        self.records, self.activations, self.skipped = [], [], []


def _why_bad(rec) -> "str | None":
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("event") == "activate":
        return None if isinstance(rec.get("t"), (int, float)) else "activate record without t"
    if "event" not in rec or "engine" not in rec or not isinstance(rec.get("t"), (int, float)):
        return "not a shim trace record (needs event, t, engine)"
    for key in ("freed", "tracked", "free", "total", "seconds", "shim_s", "restored", "taken"):
        if rec.get(key) is not None and not isinstance(rec[key], (int, float)):
            return f"{key} is not a number"
    return None


def read(paths: list) -> Trace:
    """Records of SHIM_TRACE files. A file that cannot be opened is a TraceError; a line that
    is not a whole trace record (cut by a crash, garbage) is skipped and listed."""
    trace = Trace()
    for path in paths:
        try:
            f = open(path, "rb")
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
        with f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except ValueError as exc:  # UnicodeDecodeError too
                    why = "cut mid-line" if not raw.endswith(b"\n") else \
                        f"not a JSON line ({getattr(exc, 'msg', None) or type(exc).__name__})"
                    trace.skipped.append(f"{path}:{n}: {why}")
                    continue
                why = _why_bad(rec)
                if why:
                    trace.skipped.append(f"{path}:{n}: {why}")
                    continue
                (trace.activations if rec["event"] == "activate" else trace.records).append(rec)
    trace.records.sort(key=lambda r: r["t"])
    trace.activations.sort(key=lambda r: r["t"])
    return trace


def load(paths: list) -> list:
    """The engine events of SHIM_TRACE files, by time (bad lines skipped: see :func:`read`)."""
    return read(paths).records


def _rank(rec) -> int:
    rank = rec.get("rank")
    return rank if isinstance(rank, int) else 0


def processes(trace: Trace) -> list:
    """One dict per process that recorded engine events: ``host``, ``pid``, ``rank``, ``start``,
    ``end``, ``records``. A process is (host, pid); an ``activate`` record of a (host, pid) seen
    before starts a new one (pid reused by a later run)."""
    events = sorted([(r["t"], 0, r) for r in trace.activations] + [(r["t"], 1, r) for r in trace.records],
                    key=lambda e: (e[0], e[1]))
    current: dict = {}
    procs: list = []
    for t, is_event, rec in events:
        key = (rec.get("host") or "", rec.get("pid"))
        proc = current.get(key)
        if not is_event:
            current[key] = {"host": key[0], "pid": key[1], "rank": _rank(rec), "start": t, "end": t, "records": []}
            procs.append(current[key])
            continue
        if proc is None:
            proc = current[key] = {"host": key[0], "pid": key[1], "rank": _rank(rec), "start": t - (rec.get("seconds") or 0),
                                   "end": t, "records": []}
            procs.append(proc)
        if not proc["records"]:
            proc["rank"] = _rank(rec)
        proc["records"].append(rec)
        proc["end"] = t
    return [p for p in procs if p["records"]]


def _families(trace: Trace, procs: list) -> list:
    """``procs`` in families: a process whose parent (``ppid`` of its records or of its ``activate``
    record) is a process of the trace on the same host, started no later than it, belongs to the
    parent's family (vLLM's engine-core process, spawned or forked by the trainer, carries the
    trainer's rank or none, i.e. rank 0 -- it is part of the trainer's run, not a second rank 0).
    Each family is a list, its root (the trainer process, or the first child where the parent
    recorded no engine events) first."""
    started: dict = {}  # (host, pid) -> [(t, ppid)] of its activate records
    for rec in trace.activations:
        started.setdefault((rec.get("host") or "", rec.get("pid")), []).append((rec["t"], rec.get("ppid")))
    families: list = []
    family_of: dict = {}  # id(proc) -> its family
    latest: dict = {}  # (host, pid) -> the process of that pid started last so far (pids are reused)
    orphans: dict = {}  # (host, parent pid, parent's start) -> family of a parent that recorded no events
    for proc in sorted(procs, key=lambda p: p["start"]):
        key = (proc["host"], proc["pid"])
        ppid = next((r["ppid"] for r in proc["records"] if isinstance(r.get("ppid"), int)), None)
        if ppid is None:
            ppid = next((pp for t, pp in started.get(key, ()) if t == proc["start"] and isinstance(pp, int)), None)
        parent = latest.get((proc["host"], ppid)) if ppid is not None else None
        if parent is not None:
            family = family_of[id(parent)]
        else:
            begun = [t for t, _ in started.get((proc["host"], ppid), ()) if t <= proc["start"]] if ppid else []
            if begun:
                family = orphans.get((proc["host"], ppid, max(begun)))
                if family is None:
                    family = orphans[(proc["host"], ppid, max(begun))] = []
                    families.append(family)
            else:
                family = []
                families.append(family)
        family.append(proc)
        family_of[id(proc)] = family
        latest[key] = proc
    return families


def runs(trace: Trace) -> list:
    """Processes grouped into runs, each a list of processes by rank. A child process goes with
    its parent (:func:`_families`); a family joins the earliest run it overlaps in time whose
    ranks do not include its root's; otherwise it starts a new run. Two runs written one after
    the other, or at the same time (both with a rank 0), stay apart."""
    groups: list = []
    for family in _families(trace, processes(trace)):
        rank = family[0]["rank"]
        start = min(p["start"] for p in family)
        for group in groups:
            if start <= max(p["end"] for p in group) and all(p["rank"] != rank for p in group):
                group.extend(family)
                break
        else:
            groups.append(list(family))
    return [sorted(g, key=lambda p: (p["rank"], p["start"])) for g in groups]


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def rows(trace: Trace) -> list:
    """Rows of the report table, one per process (run, rank, pid)."""
    out = []
    hosts = {p["host"] for g in runs(trace) for p in g}
    for number, group in enumerate(runs(trace), 1):
        for proc in group:
            row = {"run": number, "start": stamp(proc["start"]), "rank": proc["rank"], "pid": proc["pid"]}
            if len(hosts) > 1:
                row["host"] = proc["host"] or "?"
            row.update(_figures(proc["records"]))
            out.append(row)
    return out


def _figures(recs: list) -> dict:
    sleeps = [r for r in recs if r["event"] == "sleep" and (r.get("level") or 0) >= 1
              and r.get("effective") is not None]
    wakes = [r for r in recs if r["event"] == "wake"]
    asleep = awake = 0.0
    last: dict = {}
    for r in recs:
        key = r["engine"]
        if key in last:
            t0, was_asleep = last[key]
            d = max(r["t"] - (r.get("seconds") or 0) - t0, 0.0)
            if was_asleep:
                asleep += d
            else:
                awake += d
        last[key] = (r["t"], bool(r.get("asleep")))
    checks = [r for r in recs if r["event"] == "verify"]
    shares = [r["share"] for r in checks if isinstance(r.get("share"), (int, float))]
    freed = [r.get("freed") or 0 for r in sleeps]
    own = sorted(r["shim_s"] for r in sleeps + wakes if isinstance(r.get("shim_s"), (int, float)))
    return {
        "engines": len({r["engine"] for r in recs}),
        "cycles": min(len(sleeps), len(wakes)) if wakes else 0,
        "sleeps": len(sleeps),
        "GiB freed/sleep": f"{(sum(freed) / len(freed)) / GiB:.2f}" if freed else "-",
        "min GiB freed": f"{min(freed) / GiB:.2f}" if freed else "-",
        "ineffective": sum(1 for r in sleeps if r.get("effective") is False),
        "asleep s": f"{asleep:.1f}",
        "awake s": f"{awake:.1f}",
        "shim ms/call": f"{1000 * own[len(own) // 2]:.2f}" if own else "-",  # median, sleeps and wakes
        "weight checks": len(checks) or "-",
        "verified": sum(1 for r in checks if r.get("verdict") == "verified") if checks else "-",
        "partly verified": sum(1 for r in checks if r.get("verdict") == "partly verified") if checks else "-",
        "stale": sum(1 for r in checks if r.get("verdict") == "stale") if checks else "-",
        "min verified share": f"{100 * min(shares):.1f}%" if shares else "-",  # of the engine's bytes
    }


VERIFY_COLUMNS = ["weight checks", "verified", "partly verified", "stale", "min verified share"]
"""Columns of the weight checks (``verify`` records), shown when a trace has any."""


def skipped(trace: Trace) -> list:
    """One line per engine whose weight checks left tensors out: ``"<engine> (run n, rank r): x% of the
    engine's bytes verified; not verified: name (why), ..."`` (the reasons said once, from its last check)."""
    out = []
    for number, group in enumerate(runs(trace), 1):
        for proc in group:
            last: dict = {}
            for r in proc["records"]:
                if r["event"] == "verify" and r.get("skipped"):
                    last[r["engine"]] = r
            for engine, r in sorted(last.items()):
                more = (r.get("skipped_count") or 0) - len(r["skipped"])
                share = r.get("share")
                out.append(f"{engine} (run {number}, rank {proc['rank']}): "
                           f"{'?' if share is None else f'{100 * share:.1f}%'} of the engine's bytes verified; "
                           f"not verified: {', '.join(r['skipped'])}{f' and {more} more' if more > 0 else ''}")
    return out
