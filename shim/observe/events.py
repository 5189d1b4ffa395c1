"""Sleep/wake telemetry: one event per engine construction, sleep and wake.

Every event is one log line through ``shim.engine.log`` with the bytes the sleep allocator tracked and the bytes
the sleep gave back (read on the device, or from the sleep pool's bookkeeping where ``shim.vllm.sleep_verdict``
allows), at INFO only where it matters (:func:`_important`; the rest at DEBUG, one summary line every
``SHIM_SUMMARY_EVERY`` sleeps or 10 minutes, one at exit). With ``SHIM_TRACE=PATH`` each event is also one
JSON line of PATH (:func:`emit`), read back by ``shim.observe.tracefile`` (``python -m shim report``).
Counters (:func:`count`, :func:`gauge`) are process-wide figures other parts of the shim add to;
``shim.observe.trainer_metrics`` puts them into the trainer's logged metrics as ``shim/<name>``.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

from shim.engine import config, log

GiB = float(1 << 30)
SCHEMA = 1
SUMMARY_SECONDS = 600.0
"""At most this long between two summary lines while sleeps happen (10 minutes)."""

_lock = threading.Lock()
_summary = {"sleeps": 0, "ineffective": 0, "freed": 0, "asleep_s": 0.0, "awake_s": 0.0}
_counters: dict = {}
_gauges: dict = {}
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
    """One ``activate`` record per process that turned the shim on (which ranks and launchers it reached).

    The ``activate`` record (``rank``, ``pid``, ``ppid``, ``host``, ``argv``) marks every process that turned
    the shim on: launchers, torchrun agents, ranks.
    """
    import sys

    rank = os.environ.get("RANK")
    write_trace(path, {"v": SCHEMA, "event": "activate", "t": time.time(),
                       "rank": int(rank) if rank and rank.isdigit() else None,
                       "local_rank": log.local_rank(), "pid": os.getpid(), "ppid": os.getppid(), "host": host(),
                       "argv": list(sys.argv[:2]) if hasattr(sys, "argv") else []})


def emit(event: str, engine: str, seconds: float, **fields) -> dict:
    """Record one event: log line (INFO or DEBUG, see the module docstring), trace line, summary.

    Measured: ``mem_get_info`` right before and after the call, cached blocks given back first, or,
    where ``shim.vllm.sleep_verdict``'s rule allows, the sleep pool's bookkeeping (``measured``; see
    ``shim.vllm.sleep_check``). Log volume over a long run: INFO for each engine's construction, its
    first sleep and first wake, every ineffective sleep and the first of each kind of correction the
    shim made (the record's note); the other sleep/wake lines are DEBUG (``SHIM_DEBUG=1`` shows them);
    one INFO summary line every ``SHIM_SUMMARY_EVERY`` sleeps (default 50) or 10 minutes, and one at exit.

    With ``SHIM_TRACE=PATH`` the record is appended to PATH as one JSON line; every record carries
    ``rank`` (``RANK``/``LOCAL_RANK``), ``pid``, ``ppid`` and ``host``, and is written with one
    ``os.write`` on an ``O_APPEND`` descriptor, so many ranks can share the file without interleaving
    lines. Record keys: ``v`` (schema 1), ``event`` (``init`` | ``sleep`` | ``wake``), ``t`` (end, epoch
    seconds), ``seconds``, ``rank``, ``local_rank``, ``pid``, ``ppid`` (the parent process: a vLLM
    engine-core process names the trainer process that started it), ``host``, ``engine``
    (``<Class>#<n>``), ``level`` (sleep), ``tags`` (wake: tags woken), ``asleep`` (tags asleep after the
    event), ``tracked`` (bytes in the sleep pool before a sleep / after a wake or init), ``freed``
    (sleep) or ``restored`` (wake) or ``taken`` (init) bytes, ``effective`` (sleep: bool; else null),
    ``free`` / ``total`` (device bytes after the event; null when the device was not read),
    ``measured`` (sleep / wake: ``device`` or ``pool``), ``note``, ``shim_s`` (sleep / wake: the shim's
    own seconds around vLLM's call; ``seconds`` is vLLM's call).
    """
    now = time.time()
    rec = {"v": SCHEMA, "event": event, "t": now, "seconds": seconds, "rank": log.rank(),
           "local_rank": log.local_rank(), "pid": os.getpid(), "ppid": os.getppid(), "host": host(),
           "engine": engine}
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
            every = config.summary_every()
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
    # the first sleep checked from the pool's bookkeeping rather than the device (shim.vllm.sleep_check)
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
    every = config.summary_every()
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
    ``shim/<name>``. Never raises.

    Named process-wide counts (``weight_pushes``, ``rollouts_verified``, ``rollouts_stale``, ...),
    read with :func:`totals`; latest figures go through :func:`gauge` (``verified_share``).
    """
    try:
        with _lock:
            _counters[name] = _counters.get(name, 0) + n
    except Exception:
        pass


def gauge(name: str, value: float) -> None:
    """Set the process-wide figure ``name`` to its latest ``value`` (e.g. ``"verified_share"``: the verified
    share of the engine's bytes at the last weight check); it shows in the trainer's metrics as
    ``shim/<name>``. Never raises."""
    try:
        with _lock:
            _gauges[name] = value
    except Exception:
        pass


def gauges() -> dict:
    """Snapshot of :func:`gauge`'s figures."""
    with _lock:
        return dict(_gauges)


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
