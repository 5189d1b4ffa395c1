"""examples/trl_grpo_sleep_demo.py: the table, one line per column, SHIM_TRACE honoured."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import REPO, clean_env

DEMO = REPO / "examples" / "trl_grpo_sleep_demo.py"


def demo(cwd, *args, **env):
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, cwd=str(cwd),
                          env=clean_env(**env), timeout=900)


def test_demo_explains_columns_and_writes_the_trace(tmp_path):
    proc = demo(tmp_path, "--steps", "2", SHIM_TRACE="trace.jsonl")  # relative: the demo's directory
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("run "))
    rows = {line[:18].strip(): line[18:].split() for line in out[header + 1:header + 4]}
    assert set(rows) == {"sleep off", "sleep on", "sleep on + shim"}
    assert float(rows["sleep on"][0]) > 0.05 > float(rows["sleep on + shim"][0])  # logp difference
    assert rows["sleep on + shim"][-1] == rows["sleep off"][-1] == "4/4"
    explained = [line for line in out if line.split(":")[0] in ("logp difference", "reward",
                                                                "rollouts on trained weights")]
    assert len(explained) == 3 and "good is ~0" in explained[0]
    trace = tmp_path / "trace.jsonl"
    events = [json.loads(line)["event"] for line in trace.read_text().splitlines()]
    assert events.count("activate") == 1 and events.count("sleep") >= 3 and "init" in events  # the shim's run only
    assert f"python -m shim report {trace}" in proc.stdout


def test_demo_bad_trace_path_stops_first(tmp_path):
    proc = demo(tmp_path, SHIM_TRACE=str(tmp_path / "no" / "t.jsonl"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"SHIM_TRACE={tmp_path / 'no' / 't.jsonl'}: directory "
                                                f"{tmp_path / 'no'} does not exist"]
