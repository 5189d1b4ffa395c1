"""Sleep/wake telemetry: one event per engine construction, sleep and wake.

Every event is one INFO line through ``shim.log`` with the bytes the sleep
allocator tracked and the bytes the sleep gave back: read on the device
(``mem_get_info`` right before and after the call, cached blocks given back
first) or, where ``shim.sleep_verdict``'s rule allows, taken from the sleep
pool's bookkeeping (``measured``; see ``shim.sleep_check``). With ``SHIM_TRACE=PATH`` each
event is also appended to PATH as one JSON line; every record carries ``rank``
(``RANK``/``LOCAL_RANK``) and ``pid``, and is written with one ``os.write`` on an
``O_APPEND`` descriptor, so many ranks can share the file without interleaving
lines. At exit each rank logs one summary line.

An ``activate`` record (``rank``, ``pid``, ``ppid``, ``argv``) marks every process
that turned the shim on: launchers, torchrun agents, ranks.

Record keys: ``v`` (schema 1), ``event`` (``init`` | ``sleep`` | ``wake``), ``t``
(end, epoch seconds), ``seconds``, ``rank``, ``local_rank``, ``pid``,
``engine`` (``<Class>#<n>``), ``level`` (sleep), ``tags`` (wake: tags woken),
``asleep`` (tags asleep after the event), ``tracked`` (bytes in the sleep pool
before a sleep / after a wake or init), ``freed`` (sleep) or ``restored``
(wake) or ``taken`` (init) bytes, ``effective`` (sleep: bool; else null),
``free`` / ``total`` (device bytes after the event; null when the device was not
read), ``measured`` (sleep / wake: ``device`` or ``pool``), ``note``, ``shim_s`` (sleep /
wake: the shim's own seconds around vLLM's call; ``seconds`` is vLLM's call).
"""
from __future__ import annotations

import json
import os
import threading
import time

from shim import config, log

GiB = float(1 << 30)
SCHEMA = 1

_lock = threading.Lock()
_summary = {"sleeps": 0, "ineffective": 0, "freed": 0, "asleep_s": 0.0, "awake_s": 0.0}
_last: dict = {}          # engine -> (t, asleep?)
_atexit = [False]


def gib(n) -> str:
    return "?" if n is None else f"{n / GiB:.2f}"


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
                       "local_rank": log.local_rank(), "pid": os.getpid(), "ppid": os.getppid(),
                       "argv": list(sys.argv[:2]) if hasattr(sys, "argv") else []})


def emit(event: str, engine: str, seconds: float, **fields) -> dict:
    """Record one event: INFO line, trace line, summary."""
    now = time.time()
    rec = {"v": SCHEMA, "event": event, "t": now, "seconds": seconds, "rank": log.rank(),
           "local_rank": log.local_rank(), "pid": os.getpid(), "engine": engine}
    rec.update(fields)
    with _lock:
        _account(rec)
        if not _atexit[0]:
            import atexit

            atexit.register(summary)
            _atexit[0] = True
    log.info(_line(rec))
    path = config.trace_path()
    if path:
        try:
            write_trace(path, rec)
        except OSError as exc:
            log.warning(f"{config.SHIM_TRACE}={path}: cannot append: {exc}")
    return rec


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


def summary() -> "str | None":
    """One line per rank (also registered with atexit once an event happened)."""
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


def load(paths: list) -> list:
    records = []
    for path in paths:
        try:
            f = open(path, encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
        with f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError as exc:
                    raise TraceError(f"{path}:{n}: not a JSON line ({exc.msg})") from None
                if isinstance(rec, dict) and rec.get("event") == "activate":
                    continue  # a process that turned the shim on; no engine event
                if not isinstance(rec, dict) or "event" not in rec or "t" not in rec or "engine" not in rec:
                    raise TraceError(f"{path}:{n}: not a shim trace record (needs event, t, engine)")
                records.append(rec)
    records.sort(key=lambda r: r["t"])
    return records


def per_rank(records: list) -> list:
    """Rows of the report table, one per rank."""
    ranks: dict = {}
    for r in records:
        ranks.setdefault(r.get("rank", 0), []).append(r)
    rows = []
    for rank in sorted(ranks, key=lambda x: (str(type(x)), x)):
        recs = ranks[rank]
        sleeps = [r for r in recs if r["event"] == "sleep" and (r.get("level") or 0) >= 1
                  and r.get("effective") is not None]
        wakes = [r for r in recs if r["event"] == "wake"]
        asleep = awake = 0.0
        last: dict = {}
        for r in recs:
            key = (r.get("pid"), r["engine"])
            if key in last:
                t0, was_asleep = last[key]
                d = max(r["t"] - r.get("seconds", 0) - t0, 0.0)
                if was_asleep:
                    asleep += d
                else:
                    awake += d
            last[key] = (r["t"], bool(r.get("asleep")))
        freed = [r.get("freed") or 0 for r in sleeps]
        own = sorted(r["shim_s"] for r in sleeps + wakes if isinstance(r.get("shim_s"), (int, float)))
        rows.append({
            "rank": rank,
            "engines": len({(r.get("pid"), r["engine"]) for r in recs}),
            "cycles": min(len(sleeps), len(wakes)) if wakes else 0,
            "sleeps": len(sleeps),
            "GiB freed/sleep": f"{(sum(freed) / len(freed)) / GiB:.2f}" if freed else "-",
            "min GiB freed": f"{min(freed) / GiB:.2f}" if freed else "-",
            "ineffective": sum(1 for r in sleeps if r.get("effective") is False),
            "asleep s": f"{asleep:.1f}",
            "awake s": f"{awake:.1f}",
            "shim ms/call": f"{1000 * own[len(own) // 2]:.2f}" if own else "-",  # median, sleeps and wakes
        })
    return rows


def plot(records: list, out: str) -> None:
    """Device memory in use over time, one line per rank (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = records[0]["t"] if records else 0.0
    fig, ax = plt.subplots(figsize=(9, 4))
    ranks: dict = {}
    for r in records:
        if r.get("free") is None or r.get("total") is None:
            continue
        ranks.setdefault(r.get("rank", 0), []).append((r["t"] - t0, (r["total"] - r["free"]) / GiB))
    for rank, pts in sorted(ranks.items(), key=lambda kv: str(kv[0])):
        xs, ys = zip(*pts)
        ax.step(xs, ys, where="post", label=f"rank {rank}")
    ax.set_xlabel("seconds since first event")
    ax.set_ylabel("device memory in use (GiB)")
    ax.set_title("vLLM sleep/wake: device memory per rank")
    if ranks:
        ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
