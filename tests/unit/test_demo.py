"""examples/trl_grpo_sleep_demo.py: the table, one line per column, the verdict and its exit status (SHIM_DISABLED=1
brings the bug back in the shim's run: exit 1), SHIM_TRACE honoured, the doctor/status commands it prints work."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

from tests.support.helpers import REPO, clean_env

DEMO = REPO / "examples" / "trl_grpo_sleep_demo.py"


def demo(cwd, *args, **env):
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, cwd=str(cwd),
                          env=clean_env(**env), timeout=900)


def table(stdout: str) -> dict:
    out = stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("run "))
    rows = {line[:18].strip(): line[18:].split() for line in out[header + 1:header + 4]}
    assert set(rows) == {"sleep off", "sleep on", "sleep on + shim"}
    return rows


def test_demo_explains_columns_and_writes_the_trace(tmp_path):
    proc = demo(tmp_path, "--steps", "2", SHIM_TRACE="trace.jsonl")  # relative: the demo's directory
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    rows = table(proc.stdout)
    assert float(rows["sleep on"][0]) > 0.05 > float(rows["sleep on + shim"][0])  # logp difference
    assert rows["sleep on + shim"][-1] == rows["sleep off"][-1] == "4/4"
    explained = [line for line in out if line.split(":")[0] in ("logp difference", "reward",
                                                                "rollouts on trained weights")]
    assert len(explained) == 3 and "good is ~0" in explained[0]
    trace = tmp_path / "trace.jsonl"
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    assert events.count("activate") == 1 and events.count("sleep") >= 3 and "init" in events  # the shim's run only
    assert f"report {trace})" in proc.stdout
    assert "verdict: without the shim, TRL 1.9.2 with sleep mode on sampled 2 of 4 rollouts from stale weights" \
           in proc.stdout and proc.stdout.count("with the shim 4/4.") == 1
    # the commands it prints show doctor and status on the TRL it ran (without its PYTHONPATH: "trl not installed")
    commands = [line.strip() for line in out if line.startswith("  PYTHONPATH=")]
    assert len(commands) == 2 and commands[0].endswith(" -m shim doctor") and commands[1].endswith(" status --import")
    doctor = subprocess.run(["bash", "-c", commands[0]], capture_output=True, text=True, cwd=str(tmp_path),
                            env=clean_env(), timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "trl 1.9.2" in doctor.stdout.splitlines()[0] and "activation: through the launcher" in doctor.stdout
    assert any(line.split() == shlex.split("trl-stale-weights affected (trl 1.9.2; huggingface/trl#5312); fixed")
               for line in doctor.stdout.splitlines()), doctor.stdout
    status = subprocess.run(["bash", "-c", commands[1]], capture_output=True, text=True, cwd=str(tmp_path),
                            env=clean_env(), timeout=300)
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(line.split() for line in status.stdout.splitlines() if line.startswith("trl-stale-weights "))
    assert row[1:4] == ["trl", "1.9.2", ">=0.28.0,<1.10.0"] and row[4] == "applied", status.stdout


def test_demo_fails_when_the_shim_does_not_fix(tmp_path):
    """The claim can fail: with SHIM_DISABLED=1 (reaching the shim's run only) that run shows the bug, exit 1."""
    proc = demo(tmp_path, "--steps", "2", SHIM_DISABLED="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    rows = table(proc.stdout)
    assert rows["sleep off"][-1] == "4/4" and rows["sleep on"][-1] == rows["sleep on + shim"][-1] == "2/4"
    assert float(rows["sleep on + shim"][0]) > 0.05
    assert "with the shim only 2/4: NOT fixed (switches set: SHIM_DISABLED=1)." in proc.stdout


def test_demo_bad_trace_path_stops_first(tmp_path):
    proc = demo(tmp_path, SHIM_TRACE=str(tmp_path / "no" / "t.jsonl"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"SHIM_TRACE={tmp_path / 'no' / 't.jsonl'}: directory "
                                                f"{tmp_path / 'no'} does not exist"]
