"""One device lock for every process of the GPU kit (issue 30: the control run's crash).

vLLM's worker measures each sleep with the device-wide ``torch.cuda.mem_get_info`` and asserts
``freed_bytes >= 0`` ("Memory usage increased after sleeping"): any other process allocating on the
GPU while an engine sleeps can crash that run. The marker files (:class:`tests.gpu.common.Gate`)
order the phases, but a chain with a hole in it lets two phases meet on the device (run_all.sh with
``PHASES="trl5312 sleep"`` started the sleep phase's engines beside the trl5312 runs). So every
process that touches the GPU also takes this lock, an ``flock`` on one file (``$SHIM_GPU_LOCK``),
after its markers and before its first device work, and holds it until it exits: the kernel drops
it with the process (a crash or a kill too), after its CUDA context is gone. Processes that run
together on purpose (``runs.run_all(parallel=True)``, a barrier after CUDA init) take it shared;
everyone else exclusive.

Every acquisition and release is appended to ``$SHIM_GPU_LOCK.events`` (one JSON line each) while
the lock is held, so the file's line order is the device order (a process refused the lock also
writes one ``waiting`` line, naming the holder). ``python -m tests.gpu.devlock
EVENTS`` prints each process's interval and each phase's first start and last end, in that order,
and says whether two exclusive intervals overlapped (exit 1 if so).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import time

LOCK_ENV = "SHIM_GPU_LOCK"    # the lock file; unset: no lock (a single run by hand)
PHASE_ENV = "SHIM_GPU_PHASE"  # the run_all.sh phase a process belongs to (its events say so)

_held: list = []  # (fd, record) of this process: kept open until the process exits


def events_path(lock_path) -> str:
    return f"{lock_path}.events"


def _append(lock_path, record: dict) -> None:
    line = json.dumps(record, sort_keys=True) + "\n"
    fd = os.open(events_path(lock_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def holder(lock_path) -> str:
    """Who took the lock last, from the events file (for a message)."""
    try:
        with open(events_path(lock_path)) as f:
            last = [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):
        return "?"
    acq = [e for e in last if e.get("event") == "acquire"]
    return f"{acq[-1].get('label')} (pid {acq[-1].get('pid')})" if acq else "?"


def acquire(label: str, *, shared: bool = False, lock_path=None, deadline: "float | None" = None,
            need_s: float = 0.0, poll: float = 0.2) -> "str | None":
    """Take the device lock for the rest of this process's life. None when taken (or when no lock is
    configured); a reason when ``deadline`` came first (then the caller must not touch the device)."""
    import fcntl

    path = lock_path or os.environ.get(LOCK_ENV)
    if not path:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    record = {"label": label, "pid": os.getpid(), "phase": os.environ.get(PHASE_ENV, ""),
              "mode": "shared" if shared else "exclusive"}
    waited, refused = time.time(), False
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not refused:  # once: who waits for whom (not an interval; written without the lock)
                refused = True
                _append(path, {**record, "event": "waiting", "holder": holder(path), "t": time.time()})
                print(f"[device lock] {label} waits for {holder(path)}", flush=True)
            if deadline and time.time() + need_s > deadline:
                os.close(fd)
                return f"skipped: deadline (the device lock is held by {holder(path)})"
            time.sleep(poll)
    _append(path, {**record, "event": "acquire", "t": time.time(), "waited_s": round(time.time() - waited, 3)})
    _held.append((fd, path, record))
    if len(_held) == 1:
        atexit.register(_released)
    return None


def _released() -> None:
    """At exit: record the release; the lock itself goes with the process (its fd), after CUDA's
    teardown, so the next holder never sees this process give memory back."""
    for _fd, path, record in _held:
        try:
            _append(path, {**record, "event": "release", "t": time.time()})
        except OSError:
            pass


def release_now() -> None:
    """Drop the lock before exit (tests only; the kit holds it to the end)."""
    import fcntl

    _released()
    while _held:
        fd, _path, _record = _held.pop()
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# ---------------------------------------------------------------------------
# the events file: intervals, phases, overlaps
# ---------------------------------------------------------------------------
def read_events(path) -> list:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
    return out


def intervals(events: list) -> list:
    """[(label, pid, phase, mode, start_index, end_index, ended_by)] ordered by start (line order). A
    holder with no release line (killed: the kernel dropped its lock) ends, for the listing, where the
    next process acquires; the overlap check counts only intervals with both lines."""
    open_, done = {}, []
    for i, e in enumerate(events):
        key = (e["pid"], e["label"])
        if e["event"] == "acquire":
            open_[key] = (i, e)
        elif e["event"] == "release" and key in open_:
            j, ev = open_.pop(key)
            done.append((ev["label"], ev["pid"], ev["phase"], ev["mode"], j, i, "release"))
    for (pid, _label), (j, ev) in open_.items():
        later = [i for i, e in enumerate(events) if i > j and e["event"] == "acquire" and e["pid"] != pid]
        done.append((ev["label"], ev["pid"], ev["phase"], ev["mode"], j, later[0] if later else len(events),
                     "no release line"))
    return sorted(done, key=lambda x: x[4])


def overlaps(events: list) -> list:
    """Pairs of intervals that share a moment, where one of them is exclusive (line order only)."""
    bad = []
    ivs = [iv for iv in intervals(events) if iv[6] == "release"]
    for a in range(len(ivs)):
        for b in range(a + 1, len(ivs)):
            x, y = ivs[a], ivs[b]
            if y[4] < x[5] and "exclusive" in (x[3], y[3]):
                bad.append((x, y))
    return bad


def phases(events: list) -> list:
    """[(phase, first acquire index, last release index)] ordered by start."""
    first, last = {}, {}
    for iv in intervals(events):
        ph = iv[2] or "-"
        first.setdefault(ph, iv[4])
        last[ph] = max(last.get(ph, -1), iv[5])
    return sorted(((p, first[p], last[p]) for p in first), key=lambda x: x[1])


def report(path) -> int:
    ev = read_events(path)
    t0 = ev[0]["t"] if ev else 0.0

    def at(i):  # wall clock of event i, for reading only (the order is the line order)
        return f"+{ev[i]['t'] - t0:.1f}s" if i < len(ev) else "end"

    ivs = intervals(ev)
    for label, pid, phase, mode, s, e, how in ivs:
        print(f"[device] {phase or '-':9s} {label:28s} pid {pid:<7d} {mode:9s} events {s:3d} {at(s):>8s}"
              f" .. {e:3d} {at(e):>8s} ({how})")
    ph = phases(ev)
    for name, s, e in ph:
        print(f"[device] phase {name}: start event {s} ({at(s)}), end event {e} ({at(e)})")
    between = [f"{a[0]} ends (event {a[2]}) before {b[0]} starts (event {b[1]})" for a, b in zip(ph, ph[1:])
               if a[2] <= b[1]]
    phase_overlap = [f"{a[0]} / {b[0]}" for a, b in zip(ph, ph[1:]) if b[1] < a[2]]
    bad = overlaps(ev)
    print(f"[device] phase order: {' -> '.join(p[0] for p in ph) or 'none'}"
          + (f"; {'; '.join(between)}" if between else ""))
    print(f"[device] {len(ivs)} intervals, overlapping: {len(bad)}"
          + (f" {[(x[0], y[0]) for x, y in bad]}" if bad else "")
          + (f"; phases overlapping: {phase_overlap}" if phase_overlap else ""))
    return 1 if bad or phase_overlap else 0


if __name__ == "__main__":
    sys.exit(report(sys.argv[1]))
