"""Sleep/wake telemetry: one event per engine construction, sleep and wake.

Every event is one log line through ``shim.log`` with the bytes the sleep
allocator tracked and the bytes the sleep gave back: read on the device
(``mem_get_info`` right before and after the call, cached blocks given back
first) or, where ``shim.sleep_verdict``'s rule allows, taken from the sleep
pool's bookkeeping (``measured``; see ``shim.sleep_check``). Log volume over a
long run: INFO for each engine's construction, its first sleep and first wake,
every ineffective sleep and the first of each kind of correction the shim made
(the record's note); the other sleep/wake lines are DEBUG (``SHIM_DEBUG=1``
shows them); one INFO
summary line every ``SHIM_SUMMARY_EVERY`` sleeps (default 50) or 10 minutes,
and one at exit. With ``SHIM_TRACE=PATH`` each
event is also appended to PATH as one JSON line; every record carries ``rank``
(``RANK``/``LOCAL_RANK``), ``pid`` and ``host``, and is written with one ``os.write`` on an
``O_APPEND`` descriptor, so many ranks can share the file without interleaving
lines.

An ``activate`` record (``rank``, ``pid``, ``ppid``, ``host``, ``argv``) marks every process
that turned the shim on: launchers, torchrun agents, ranks.

Record keys: ``v`` (schema 1), ``event`` (``init`` | ``sleep`` | ``wake``), ``t``
(end, epoch seconds), ``seconds``, ``rank``, ``local_rank``, ``pid``, ``host``,
``engine`` (``<Class>#<n>``), ``level`` (sleep), ``tags`` (wake: tags woken),
``asleep`` (tags asleep after the event), ``tracked`` (bytes in the sleep pool
before a sleep / after a wake or init), ``freed`` (sleep) or ``restored``
(wake) or ``taken`` (init) bytes, ``effective`` (sleep: bool; else null),
``free`` / ``total`` (device bytes after the event; null when the device was not
read), ``measured`` (sleep / wake: ``device`` or ``pool``), ``note``, ``shim_s`` (sleep /
wake: the shim's own seconds around vLLM's call; ``seconds`` is vLLM's call).

Counters (:func:`count`, :func:`totals`): named process-wide counts other parts
of the shim add to (``weight_pushes``, ``rollouts_verified``, ``rollouts_stale``,
...); ``shim.metrics`` puts them, with the sleep figures, into the trainer's
logged metrics as ``shim/<name>``.

``python -m shim report`` reads trace files back (:func:`read`): lines cut by a
crash or that are not trace records are skipped and counted; each process is
told apart by host, pid and start, and processes are grouped into runs
(:func:`runs`), so two runs in one file are never merged into one rank 0.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from shim import config, log

GiB = float(1 << 30)
SCHEMA = 1
SUMMARY_SECONDS = 600.0
"""At most this long between two summary lines while sleeps happen (10 minutes)."""

_lock = threading.Lock()
_summary = {"sleeps": 0, "ineffective": 0, "freed": 0, "asleep_s": 0.0, "awake_s": 0.0}
_counters: dict = {}
_last: dict = {}          # engine -> (t, asleep?)
_seen: dict = {}          # engine -> {"sleep": n, "wake": n} events logged so far
_periodic = {"sleeps": 0, "t": None}  # sleeps since the last summary line; when it was printed
_atexit = [False]
_host: list = []


def gib(n) -> str:
    return "?" if n is None else f"{n / GiB:.2f}"


def host() -> str:
    if not _host:
        try:
            _host.append(socket.gethostname())
        except Exception:
            _host.append("")
    return _host[0]


def _line(rec: dict) -> str:
    ev, eng = rec["event"], rec["engine"]
    secs = f"{rec['seconds']:.3f} s"
    if ev == "sleep":
        pct = ""
        if rec.get("tracked"):
            pct = f" ({100.0 * (rec.get('freed') or 0) / rec['tracked']:.0f}%)"
        verdict = "" if rec.get("effective") is None else (" effective" if rec["effective"] else " INEFFECTIVE")
        if rec.get("measured") == "pool":
            pct += " by the pool's bookkeeping"
        return (f"sleep {eng} level={rec.get('level')}: freed {gib(rec.get('freed'))} GiB of "
                f"{gib(rec.get('tracked'))} GiB tracked{pct} in {secs};{verdict}"
                + (f" ({rec['note']})" if rec.get("note") else ""))
    if ev == "wake":
        return (f"wake {eng} tags={','.join(rec.get('tags') or []) or '-'}: restored {gib(rec.get('restored'))} GiB "
                f"in {secs}; asleep now: {','.join(rec.get('asleep') or []) or 'none'}"
                + (f" ({rec['note']})" if rec.get("note") else ""))
    return (f"{ev} {eng}: took {gib(rec.get('taken'))} GiB, {gib(rec.get('tracked'))} GiB in the sleep pool, "
            f"in {secs}" + (f" ({rec['note']})" if rec.get("note") else ""))


def write_trace(path: str, rec: dict) -> None:
    data = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def record_activation(path: str) -> None:
    """One ``activate`` record per process that turned the shim on (which ranks and launchers it reached)."""
    import sys

    rank = os.environ.get("RANK")
    write_trace(path, {"v": SCHEMA, "event": "activate", "t": time.time(),
                       "rank": int(rank) if rank and rank.isdigit() else None,
                       "local_rank": log.local_rank(), "pid": os.getpid(), "ppid": os.getppid(), "host": host(),
                       "argv": list(sys.argv[:2]) if hasattr(sys, "argv") else []})


def _summary_every() -> int:
    try:
        return config.summary_every()
    except config.ConfigError:
        return config.SUMMARY_EVERY_DEFAULT


def emit(event: str, engine: str, seconds: float, **fields) -> dict:
    """Record one event: log line (INFO or DEBUG, see the module docstring), trace line, summary."""
    now = time.time()
    rec = {"v": SCHEMA, "event": event, "t": now, "seconds": seconds, "rank": log.rank(),
           "local_rank": log.local_rank(), "pid": os.getpid(), "host": host(), "engine": engine}
    rec.update(fields)
    with _lock:
        _account(rec)
        important, first_wake = _important(rec)
        periodic = _periodic_due(rec, now)
        if not _atexit[0]:
            import atexit

            atexit.register(summary)
            _atexit[0] = True
    if important or log.debugging():  # a routine line that nobody sees is not formatted
        line = _line(rec)
        if first_wake:
            every = _summary_every()
            line += ("; further sleep/wake lines are DEBUG (SHIM_DEBUG=1 shows them), "
                     + (f"a summary every {every} sleeps or 10 minutes" if every else "a summary at exit"))
        log.event(line, important)
    if periodic:
        summary()
    path = config.trace_path()
    if path:
        try:
            write_trace(path, rec)
        except OSError as exc:
            log.warning(f"{config.SHIM_TRACE}={path}: cannot append: {exc}")
    return rec


def _important(rec: dict) -> tuple:
    """(log at INFO?, is this the engine's first wake?): construction, the first sleep and the
    first wake of each engine, every ineffective sleep, the first event of each kind of note
    per engine (a correction the shim made: "woke it first", "the others were awake", the
    first-sleep reset) and the first sleep verified another way than the first (``measured``:
    ``pool`` after ``device``); routine repeats are DEBUG."""
    seen = _seen.setdefault(rec["engine"], {"sleep": 0, "wake": 0, "notes": set()})
    ev = rec["event"]
    if ev not in ("sleep", "wake"):
        return True, False
    seen[ev] += 1
    first = seen[ev] == 1
    problem = ev == "sleep" and rec.get("effective") is False
    note = rec.get("note") or ""
    kind = (ev, note.split(":")[0])
    new_note = bool(note) and kind not in seen["notes"]
    if note:
        seen["notes"].add(kind)
    # the first sleep checked from the pool's bookkeeping rather than the device (shim.sleep_check)
    way = ("measured", rec.get("measured")) if ev == "sleep" and rec.get("measured") else None
    new_way = way is not None and way not in seen["notes"] and not first
    if way is not None:
        seen["notes"].add(way)
    return first or problem or new_note or new_way, first and ev == "wake"


def _periodic_due(rec: dict, now: float) -> bool:
    if _periodic["t"] is None:
        _periodic["t"] = now
    if rec["event"] != "sleep":
        return False
    _periodic["sleeps"] += 1
    every = _summary_every()
    due = (every and _periodic["sleeps"] >= every) or now - _periodic["t"] >= SUMMARY_SECONDS
    if due:
        _periodic["sleeps"], _periodic["t"] = 0, now
    return bool(due)


def _account(rec: dict) -> None:
    eng, t = rec["engine"], rec["t"]
    asleep_now = bool(rec.get("asleep"))
    prev = _last.get(eng)
    if prev is not None:
        start = t - rec["seconds"]
        _summary["asleep_s" if prev[1] else "awake_s"] += max(start - prev[0], 0.0)
    _last[eng] = (t, asleep_now)
    if rec["event"] == "sleep" and rec.get("level", 0) >= 1 and rec.get("effective") is not None:
        _summary["sleeps"] += 1
        _summary["freed"] += rec.get("freed") or 0
        if rec.get("effective") is False:
            _summary["ineffective"] += 1


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to the process-wide counter ``name`` (e.g. ``"weight_pushes"``,
    ``"rollouts_verified"``, ``"rollouts_stale"``); it shows in the trainer's metrics as
    ``shim/<name>``. Never raises."""
    try:
        with _lock:
            _counters[name] = _counters.get(name, 0) + n
    except Exception:
        pass


def totals() -> dict:
    """Snapshot: ``sleeps`` (measured, level >= 1), ``ineffective``, ``freed`` (bytes, all
    sleeps), ``engines`` (engines seen), and every counter of :func:`count` under its name."""
    with _lock:
        out = {k: _summary[k] for k in ("sleeps", "ineffective", "freed")}
        out["engines"] = len(_last)
        out.update(_counters)
    return out


def summary() -> "str | None":
    """One line per rank: every ``SHIM_SUMMARY_EVERY`` sleeps or 10 minutes, and at exit (atexit)."""
    s = dict(_summary)
    if not s["sleeps"] and not _last:
        return None
    per = s["freed"] / s["sleeps"] if s["sleeps"] else 0
    line = (f"sleep summary rank {log.rank()}: {s['sleeps']} sleeps, {s['ineffective']} ineffective, "
            f"{per / GiB:.2f} GiB freed per sleep, asleep {s['asleep_s']:.1f} s, awake {s['awake_s']:.1f} s")
    try:
        log.info(line)
    except Exception:  # interpreter shutting down
        pass
    return line


# ---------------------------------------------------------------------------
# python -m shim report
# ---------------------------------------------------------------------------
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


def runs(trace: Trace) -> list:
    """Processes grouped into runs, each a list of processes by rank. A process joins the
    earliest run it overlaps in time whose ranks do not include its own; otherwise it starts
    a new run. Two runs written one after the other, or at the same time (both with a rank 0),
    stay apart."""
    groups: list = []
    for proc in sorted(processes(trace), key=lambda p: (p["start"], p["rank"])):
        for group in groups:
            if proc["start"] <= max(p["end"] for p in group) and all(p["rank"] != proc["rank"] for p in group):
                group.append(proc)
                break
        else:
            groups.append([proc])
    return [sorted(g, key=lambda p: p["rank"]) for g in groups]


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def rows(trace: Trace) -> list:
    """Rows of the report table, one per process (run, rank, pid)."""
    out = []
    hosts = {p["host"] for g in runs(trace) for p in g}
    for number, group in enumerate(runs(trace), 1):
        for proc in group:
            row = {"run": number, "start": _stamp(proc["start"]), "rank": proc["rank"], "pid": proc["pid"]}
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
    }


INEFFECTIVE_COLOUR = "#d62728"
"""Red, kept out of the ranks' colours: ineffective sleeps stand out."""


def plot(trace: "Trace | list", out: str) -> None:
    """:func:`figure` written to ``out``. Raises OSError / ValueError when it cannot be written."""
    import matplotlib.pyplot as plt

    fig = figure(trace)
    try:
        fig.savefig(out)
    finally:
        plt.close(fig)


def figure(trace: "Trace | list"):
    """Device memory in use over time (needs matplotlib): one panel per run, one colour per
    rank; the sleep pool's size as a dashed line; sleeps (v) and wakes (^) marked, ineffective
    sleeps as large red crosses; the memory axis starts at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(trace, list):
        records, trace = trace, Trace()
        trace.records = sorted(records, key=lambda r: r["t"])
    groups = runs(trace) or [[]]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 3.2 * len(groups) + 0.8), squeeze=False)
    colours = [c for c in plt.rcParams["axes.prop_cycle"].by_key().get("color", []) if c != INEFFECTIVE_COLOUR] or ["C0"]
    marked_bad = False
    for number, (group, ax) in enumerate(zip(groups, axes[:, 0]), 1):
        t0 = min((p["start"] for p in group), default=0.0)
        for i, proc in enumerate(group):
            colour = colours[i % len(colours)]
            pts = [(r["t"] - t0, (r["total"] - r["free"]) / GiB, r) for r in proc["records"]
                   if r.get("free") is not None and r.get("total") is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax.step(xs, [p[1] for p in pts], where="post", color=colour,
                    label=f"rank {proc['rank']} in use (pid {proc['pid']})")
            pool = [(x, r["tracked"] / GiB) for x, _, r in pts if isinstance(r.get("tracked"), (int, float))]
            if pool:
                ax.step([p[0] for p in pool], [p[1] for p in pool], where="post", color=colour, linestyle="--",
                        linewidth=1, label=f"rank {proc['rank']} sleep pool")
            for marker, event in (("v", "sleep"), ("^", "wake")):
                sel = [(x, y) for x, y, r in pts if r["event"] == event and r.get("effective") is not False]
                if sel:
                    ax.plot([p[0] for p in sel], [p[1] for p in sel], linestyle="none", marker=marker,
                            color=colour, markersize=5)
            bad = [(x, y) for x, y, r in pts if r["event"] == "sleep" and r.get("effective") is False]
            if bad:
                ax.plot([p[0] for p in bad], [p[1] for p in bad], linestyle="none", marker="X", color=INEFFECTIVE_COLOUR,
                        markersize=11, markeredgecolor="black", zorder=5,
                        label=None if marked_bad else "ineffective sleep")
                marked_bad = True
        ax.set_ylim(bottom=0)
        ax.set_ylabel("device memory (GiB)")
        ax.set_title(f"run {number}, started {_stamp(t0)}: v sleep, ^ wake, dashed: sleep pool" if group
                     else "no events")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run's first event")
    fig.tight_layout()
    return fig
