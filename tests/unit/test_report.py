"""``python -m shim report`` on real-life traces (crashed runs, several runs in one file), ``--plot``,
the subcommands' ``--help`` and the launcher's ``--trace PATH`` check (``shim.cli.common.check_trace_path``).

Traces are written in the shim's own record format (``shim.observe.events``), as a run of N ranks
writes them: one ``activate`` record per process, then its engine's init / sleep / wake events.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from shim.cli import common
from shim.observe import plot, tracefile
from tests.support.helpers import REPO, clean_env

GiB = 1 << 30
HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def shim_cli(*args, cwd=REPO):
    env = clean_env(PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shim", *args], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=120)


def process_records(pid, rank, t0, cycles=2, ineffective=(), host="node1"):
    """What one rank's process appends: activate, init, then sleep/wake cycles (level 1, 10 GiB pool)."""
    total, pool = 80 * GiB, 10 * GiB
    base = {"v": 1, "rank": rank, "local_rank": rank, "pid": pid, "host": host, "engine": "LLMEngine#1"}
    recs = [{"v": 1, "event": "activate", "t": t0, "rank": rank, "local_rank": rank, "pid": pid, "ppid": 1,
             "host": host, "argv": ["train.py"]},
            dict(base, event="init", t=t0 + 1, seconds=0.5, taken=pool, tracked=pool, asleep=[],
                 free=total - pool - GiB, total=total, note="")]
    t = t0 + 1
    for i in range(cycles):
        bad = i in ineffective
        freed = 0 if bad else pool
        t += 2
        recs.append(dict(base, event="sleep", t=t, seconds=0.05, level=1, tracked=pool, freed=freed,
                         effective=not bad, asleep=["kv_cache", "weights"], free=total - GiB - (pool - freed),
                         total=total, note="", shim_s=0.0003))
        t += 3
        recs.append(dict(base, event="wake", t=t, seconds=0.07, tags=["kv_cache", "weights"], restored=freed,
                         tracked=pool, asleep=[], free=total - pool - GiB, total=total, note="", shim_s=0.0004))
    return recs


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def table(stdout):
    lines = stdout.splitlines()
    header = lines[0].split()
    # two-word column names: "GiB freed/sleep", "min GiB freed", "asleep s", "awake s", "shim ms/call"
    assert header[:6] == ["run", "start", "rank", "pid", "engines", "cycles"], lines[0]
    return [line.split() for line in lines[1:]]


# ---------------------------------------------------------------------------
# a trace of a crashed / killed run
# ---------------------------------------------------------------------------
def test_report_skips_cut_and_garbage_lines(tmp_path):
    recs = process_records(100, 0, 1000.0, cycles=3)
    cut = json.dumps(process_records(100, 0, 1000.0, cycles=4)[-1])[:37]  # the write a kill interrupted
    trace = write(tmp_path / "t.jsonl", recs[:4] + ["garbage"] + recs[4:], tail=cut)
    trace.write_text(trace.read_text().replace('"garbage"', "\x00\x01 not json {", 1))
    proc = shim_cli("report", str(trace))
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    assert len(rows) == 1 and rows[0][2:4] == ["0", "100"]
    assert rows[0][5:7] == ["3", "3"]  # cycles, sleeps: every whole record counted
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("shim: report: skipped 2 line(s) that are not whole trace records")
    assert f"{trace}:5: not a JSON line" in err[0] and f"{trace}:{len(recs) + 2}: cut mid-line" in err[0]


def test_report_skips_records_of_the_wrong_shape(tmp_path):
    recs = process_records(100, 0, 1000.0)
    recs.insert(3, {"event": "sleep", "t": "yesterday", "engine": "E#1"})
    recs.insert(3, [1, 2, 3])
    recs.insert(3, dict(recs[2], freed="a lot"))
    proc = shim_cli("report", str(write(tmp_path / "t.jsonl", recs)))
    assert proc.returncode == 0 and "skipped 3 line(s)" in proc.stderr
    assert "freed is not a number" in proc.stderr and "not a JSON object" in proc.stderr


def test_report_errors_are_one_line(tmp_path):
    missing = shim_cli("report", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 1 and missing.stderr.strip().splitlines() == [
        f"shim: report: cannot read {tmp_path / 'nope.jsonl'}: No such file or directory"]
    only_garbage = write(tmp_path / "g.jsonl", [], tail="{not json\n")
    proc = shim_cli("report", str(only_garbage))
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"shim: report: no events in {only_garbage}"
    assert shim_cli("report").returncode == 2
    assert shim_cli("report", "--nope", "x").returncode == 2


# ---------------------------------------------------------------------------
# several runs: in one file, at the same time, in several files
# ---------------------------------------------------------------------------
def test_successive_runs_in_one_file_are_told_apart(tmp_path):
    first = process_records(100, 0, 1000.0, cycles=2, ineffective=(1,))  # one rank
    second = process_records(200, 0, 5000.0, cycles=5) + process_records(201, 1, 5000.2, cycles=3)  # an hour later
    proc = shim_cli("report", str(write(tmp_path / "t.jsonl", first + second)))
    assert proc.returncode == 0, proc.stderr
    rows = table(proc.stdout)
    assert [r[0] for r in rows] == ["1", "2", "2"]
    assert [(r[2], r[3]) for r in rows] == [("0", "100"), ("0", "200"), ("1", "201")]
    assert [r[6] for r in rows] == ["2", "5", "3"]  # sleeps per process, never merged into one rank 0
    assert [r[9] for r in rows] == ["1", "0", "0"]  # ineffective
    assert rows[0][1] != rows[1][1]  # start


def test_concurrent_runs_and_several_files(tmp_path):
    """Two 2-rank runs writing at the same time (two jobs, one trace path), then a file per rank."""
    a = process_records(100, 0, 1000.0) + process_records(101, 1, 1000.1)
    b = process_records(300, 0, 1000.5, cycles=3) + process_records(301, 1, 1000.6, cycles=3)
    mixed = sorted(a + b, key=lambda r: r["t"])
    rows = table(shim_cli("report", str(write(tmp_path / "t.jsonl", mixed))).stdout)
    assert [(r[0], r[2], r[3]) for r in rows] == [("1", "0", "100"), ("1", "1", "101"), ("2", "0", "300"),
                                                  ("2", "1", "301")]
    files = [write(tmp_path / f"rank{i}.jsonl", process_records(400 + i, i, 2000.0 + i / 10)) for i in range(3)]
    rows = table(shim_cli("report", *map(str, files)).stdout)
    assert [(r[0], r[2]) for r in rows] == [("1", "0"), ("1", "1"), ("1", "2")]


def test_same_pid_in_two_runs_and_two_hosts(tmp_path):
    recs = (process_records(100, 0, 1000.0) + process_records(100, 0, 9000.0)  # pid reused by a later run
            + process_records(100, 1, 1000.1, host="node2"))  # the same pid on another node of run 1
    proc = shim_cli("report", str(write(tmp_path / "t.jsonl", recs)))
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:5] == ["run", "start", "rank", "pid", "host"]
    assert [line.split()[:5:2] for line in lines[1:]] == [
        ["1", "0", "node1"], ["1", "1", "node2"], ["2", "0", "node1"]]


# ---------------------------------------------------------------------------
# --plot
# ---------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_MPL, reason="matplotlib not installed (tests/requirements.txt pins it)")
def test_plot_panels_pool_line_zero_axis_and_ineffective_marks(tmp_path):
    recs = (process_records(100, 0, 1000.0, cycles=3, ineffective=(1,)) + process_records(101, 1, 1000.1)
            + process_records(200, 0, 5000.0))
    path = write(tmp_path / "t.jsonl", recs)
    fig = plot.figure(tracefile.read([str(path)]))
    axes = fig.get_axes()
    assert len(axes) == 2  # one panel per run
    for ax in axes:
        assert ax.get_ylim()[0] == 0
    labels = [line.get_label() for line in axes[0].get_lines()]
    assert "rank 0 sleep pool" in labels and "rank 1 sleep pool" in labels
    pool = next(line for line in axes[0].get_lines() if line.get_label() == "rank 0 sleep pool")
    assert pool.get_linestyle() == "--" and max(pool.get_ydata()) == 10.0
    bad = [line for line in axes[0].get_lines() if line.get_label() == "ineffective sleep"]
    assert len(bad) == 1 and len(bad[0].get_xdata()) == 1 and bad[0].get_color() == plot.INEFFECTIVE_COLOUR
    ranks = [line.get_color() for line in axes[0].get_lines() if line.get_label().endswith("in use (pid 100)")
             or line.get_label().endswith("in use (pid 101)")]
    assert len(set(ranks)) == 2 and plot.INEFFECTIVE_COLOUR not in ranks  # a colour per rank, red kept apart
    markers = {line.get_marker() for line in axes[0].get_lines() if line.get_linestyle() in ("None", "none", "")}
    assert {"v", "^", "X"} <= markers  # sleeps, wakes, ineffective sleeps
    assert not [line for line in axes[1].get_lines() if line.get_label() == "ineffective sleep"]
    import matplotlib.pyplot as plt

    plt.close(fig)
    png = tmp_path / "mem.png"
    proc = shim_cli("report", str(path), "--plot", str(png))
    assert proc.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", proc.stderr


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib not installed (tests/requirements.txt pins it)")
@pytest.mark.parametrize("where", ["missing-dir", "a-directory", "unknown-format"])
def test_plot_to_a_path_that_cannot_be_written(tmp_path, where):
    path = write(tmp_path / "t.jsonl", process_records(100, 0, 1000.0))
    out = {"missing-dir": tmp_path / "no" / "such" / "m.png", "a-directory": tmp_path,
           "unknown-format": tmp_path / "m.nosuchformat"}[where]
    proc = shim_cli("report", str(path), "--plot", str(out))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shim: report: cannot write the plot to {out}: "), err
    assert table(proc.stdout)  # the table was printed first


# ---------------------------------------------------------------------------
# --help, --trace PATH
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["status", "doctor", "report", "install", "uninstall"])
def test_subcommand_help(sub):
    for flag in ("--help", "-h"):
        proc = shim_cli(sub, flag)
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: python -m shim {sub}"), proc.stderr
        assert proc.stderr == ""


def test_check_trace_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert common.check_trace_path("") == ("", None)
    path, error = common.check_trace_path("t.jsonl")
    assert error is None and path == str(tmp_path / "t.jsonl") and os.path.isabs(path)
    assert not os.path.exists(path)  # the check leaves nothing behind
    (tmp_path / "old.jsonl").write_text("keep\n")
    assert common.check_trace_path("old.jsonl") == (str(tmp_path / "old.jsonl"), None)
    assert (tmp_path / "old.jsonl").read_text() == "keep\n"
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert common.check_trace_path("../t.jsonl")[0] == str(tmp_path / "t.jsonl")
    assert common.check_trace_path("~/t.jsonl")[0] == os.path.join(os.path.expanduser("~"), "t.jsonl")
    for bad, why in ((str(tmp_path), "is a directory"), (str(tmp_path / "no" / "t.jsonl"), "does not exist"),
                     (str(tmp_path / "old.jsonl" / "t.jsonl"), "does not exist"),
                     ("/proc/shim-trace.jsonl", "cannot write")):
        path, error = common.check_trace_path(bad)
        assert path is None and error.startswith(f"--trace {bad}: ") and why in error and "\n" not in error


def test_doctor_lists_the_metrics_feature_apart_from_bugs():
    proc = shim_cli("doctor")
    features = proc.stdout.split("features and checks:\n")[1]
    assert re.search(r"^  shim-metrics +on ", features, re.M), proc.stdout
    assert "shim-metrics" not in proc.stdout.split("features and checks:")[0]  # not among the known bugs
    for name in ("shim-metrics", "trainer-metrics"):  # the bug id, and its first site's id (an alias)
        env_off = shim_cli_env("doctor", SHIM_DISABLED_PATCHES=name)
        assert env_off.returncode == proc.returncode  # a feature switched off is not a bug left unhandled
        assert re.search(r"^  shim-metrics +off \(disabled\)", env_off.stdout, re.M), (name, env_off.stdout)


def shim_cli_env(*args, **env):
    return subprocess.run([sys.executable, "-m", "shim", *args], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=str(REPO), **env), cwd=str(REPO), timeout=120)


def test_launcher_checks_the_trace_path_before_the_command(tmp_path):
    """``python -m shim --trace PATH CMD``: an unwritable PATH stops before CMD (one line, exit 2); a
    relative PATH reaches the child absolute, so a child that changes directory still appends there."""
    marker = tmp_path / "ran"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    bad = tmp_path / "no" / "t.jsonl"
    proc = shim_cli("--trace", str(bad), *cmd)
    assert proc.returncode == 2 and not marker.exists()
    assert proc.stderr.strip().splitlines() == [f"shim: --trace {bad}: directory {tmp_path / 'no'} does not exist"]
    probe = [sys.executable, "-c", "import os; print(os.environ['SHIM_TRACE'])"]
    proc = shim_cli("--trace", "rel.jsonl", *probe, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == str(tmp_path / "rel.jsonl")
