"""The GPU kit's device lock (tests/gpu/devlock.py, taken by ``common.Gate``) on CPU: two processes
that both want the device get it one after the other (issue 30: the trl5312 and sleep phases met on
the GPU and vLLM's sleep assert killed a run). No timing: each child, once it holds the lock, waits
until the other was refused the lock (its ``waiting`` line) or has started too, so overlap is certain
wherever the lock does not serialize; the order of the lines the children append decides.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.gpu import common, devlock

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="flock: POSIX only")

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from tests.gpu import common, devlock
log, name, others, then = sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5]
events = devlock.events_path(os.environ.get(devlock.LOCK_ENV, "/nonexistent"))

def say(word):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(fd, f"{word} {name}\n".encode())
    os.close(fd)

def lines():
    with open(log) as f:
        return f.read().splitlines()

def refused(other):  # the other asked for the lock and was told to wait
    try:
        with open(events) as f:
            return any(e["event"] == "waiting" and e["label"] == other for e in map(json.loads, f))
    except OSError:
        return False

say("try")
reason = common.Gate([], label=name, shared=os.environ.get("SHARED") == "1", poll=0.02).wait()
assert reason is None, reason
say("start")
# hold "the device" until every other child either started too (no lock, shared lock) or was refused
while not all(f"start {o}" in lines() or refused(o) for o in others):
    time.sleep(0.02)
if then == "kill-first" and not any(f"start {o}" in lines() for o in others):
    os.kill(os.getpid(), 9)  # the first holder dies without a word: no release line, the kernel drops the lock
say("end")
"""


def run_children(tmp_path, names, *, lock=True, then="end", shared=False):
    log = tmp_path / "order.txt"
    lock_path = tmp_path / "device.lock"
    env = {k: v for k, v in os.environ.items() if k not in (devlock.LOCK_ENV, devlock.PHASE_ENV)}
    if lock:
        env[devlock.LOCK_ENV] = str(lock_path)
    if shared:
        env["SHARED"] = "1"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(common.REPO), str(log), n,
                               ",".join(o for o in names if o != n), then],
                              env={**env, devlock.PHASE_ENV: f"phase-{n}"})
             for n in names]
    rcs = [p.wait(timeout=120) for p in procs]
    order = [tuple(line.split()) for line in log.read_text().splitlines()]
    events = devlock.read_events(devlock.events_path(lock_path)) if lock else []
    return rcs, order, events


def intervals_overlap(order):
    """Pairs of children whose start..end spans share a moment (by line order)."""
    span = {}
    for i, (word, name) in enumerate(order):
        if word in ("start", "end"):
            span.setdefault(name, {})[word] = i
    names = sorted(span)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if span[a]["start"] < span[b].get("end", len(order)) and span[b]["start"] < span[a].get("end", len(order))]


def test_two_processes_take_the_device_one_after_the_other(tmp_path):
    rcs, order, events = run_children(tmp_path, ["A", "B"])
    assert rcs == [0, 0], order
    assert intervals_overlap(order) == [], order
    # the second one asked while the first held the lock, and started only after the first ended
    starts = [n for w, n in order if w == "start"]
    first, second = starts
    assert order.index(("try", second)) < order.index(("end", first)) < order.index(("start", second)), order
    # the lock's own record says the same
    assert [(e["event"], e["label"]) for e in events] == [("acquire", first), ("waiting", second),
                                                          ("release", first), ("acquire", second),
                                                          ("release", second)]
    assert devlock.overlaps(events) == []
    assert [p[0] for p in devlock.phases(events)] == [f"phase-{first}", f"phase-{second}"]


def test_control_without_the_lock_the_children_overlap(tmp_path):
    """The check above can fail: with no lock configured both hold 'the device' at once."""
    rcs, order, _ = run_children(tmp_path, ["A", "B"], lock=False)
    assert rcs == [0, 0], order
    assert intervals_overlap(order) == [("A", "B")], order


def test_a_killed_holder_gives_the_lock_back(tmp_path):
    """The kernel drops the flock with the process (the watchdog's kill, a crash): the next one goes on."""
    rcs, order, events = run_children(tmp_path, ["A", "B"], then="kill-first")
    killed = [n for w, n in order if w == "start"][0]
    other = "B" if killed == "A" else "A"
    assert rcs[["A", "B"].index(killed)] == -9 and rcs[["A", "B"].index(other)] == 0, (rcs, order)
    assert ("end", killed) not in order, order
    assert order.index(("try", other)) < order.index(("start", other)), order
    assert order.index(("start", killed)) < order.index(("start", other)), order
    ivs = devlock.intervals(events)
    assert [(iv[0], iv[6]) for iv in ivs][0] == (killed, "no release line"), ivs


def test_shared_holders_run_together(tmp_path):
    """``runs.run_all(parallel=True)`` (a barrier after CUDA init) takes it shared: both at once."""
    rcs, order, events = run_children(tmp_path, ["A", "B"], shared=True)
    assert rcs == [0, 0], order
    assert intervals_overlap(order) == [("A", "B")], order
    assert {e["mode"] for e in events} == {"shared"} and devlock.overlaps(events) == []


def test_report_flags_overlap(tmp_path, capsys):
    ev = [{"event": "acquire", "label": "x", "pid": 1, "phase": "trl5312", "mode": "exclusive", "t": 0.0},
          {"event": "acquire", "label": "y", "pid": 2, "phase": "sleep", "mode": "exclusive", "t": 1.0},
          {"event": "release", "label": "x", "pid": 1, "phase": "trl5312", "mode": "exclusive", "t": 2.0},
          {"event": "release", "label": "y", "pid": 2, "phase": "sleep", "mode": "exclusive", "t": 3.0}]
    path = tmp_path / "ev"
    path.write_text("".join(json.dumps(e) + "\n" for e in ev))
    assert devlock.report(path) == 1
    assert "overlapping: 1" in capsys.readouterr().out
    path.write_text("".join(json.dumps(e) + "\n" for e in (ev[0], ev[2], ev[1], ev[3])))
    assert devlock.report(path) == 0
    assert "trl5312 ends (event 1) before sleep starts (event 2)" in capsys.readouterr().out


FLAKY = r"""
import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--out"); p.add_argument("--label")
a, _ = p.parse_known_args()
flag = os.path.join(os.path.dirname(a.out), "crashed-once")
if not os.path.exists(flag):
    open(flag, "w").close()
    raise AssertionError("Memory usage increased after sleeping.")
json.dump({"label": a.label, "metrics": [{"reward": 1.0}]}, open(a.out, "w"))
"""


def test_a_run_killed_by_the_sleep_assert_is_run_once_more_alone(tmp_path, monkeypatch):
    """Where overlap cannot be excluded (``parallel``, a process outside the lock): vLLM's sleep assert
    in a run's log makes runs.run_all run it once more, after the others, and say why."""
    from tests.gpu import runs

    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    monkeypatch.setattr(common, "GRPO_RUN", script)
    res = runs.run_all([runs.Run("flaky", "")], "model", tmp_path / "w", trl={}, timeout=120)
    r = res["flaky"]
    assert r["rc"] == 0 and not r.get("error") and r["metrics"], r
    assert "Memory usage increased after sleeping" in r["retried"], r
    assert r["first_attempt"]["rc"] == 1 and "Memory usage increased" in r["first_attempt"]["error"], r
