"""The warm children of the tests (tests/support/warm.py) behave as fresh interpreters: same output,
exit code, argv, path, cwd and environment as a plain ``subprocess.run``, each test's own."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import warm
from tests.support.helpers import REPO, clean_env

PROGRAM = Path(__file__).parent / "children" / "warm_probe.py"


def both(tmp_path, exit_with=None, argv=None):
    env = clean_env(WARM_VAR="x", PYTHONPATH=str(tmp_path / "first"), OMP_NUM_THREADS="1")
    if exit_with is not None:
        env["WARM_EXIT"] = exit_with
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.read_text())
    argv = argv or [str(script), "a1"]
    cold = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    hot = warm.run(sys.executable, argv, env, str(tmp_path), 120)
    return cold, hot


@pytest.mark.parametrize("exit_with", [None, "0", "3", "raise", "message"])
def test_warm_child_matches_a_fresh_interpreter(tmp_path, exit_with):
    assert warm.server_for(sys.executable, ["-c", "pass"], clean_env(OMP_NUM_THREADS="1")) is not None
    cold, hot = both(tmp_path, exit_with)
    assert hot.returncode == cold.returncode
    record = [line for line in hot.stdout.splitlines() if line.startswith("{")]
    assert record == [line for line in cold.stdout.splitlines() if line.startswith("{")]  # argv, path, cwd, env
    assert sorted(hot.stdout.splitlines()) == sorted(cold.stdout.splitlines())  # atexit and the thread ran
    assert "to stderr" in hot.stderr.splitlines()
    assert hot.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]  # the traceback's last line / message


def test_warm_dash_c_and_module(tmp_path):
    code = "import sys, json; print(json.dumps([sys.argv, sys.path[0]]))"
    cold, hot = both(tmp_path, argv=["-c", code, "x"])
    assert hot.stdout == cold.stdout and hot.returncode == 0
    cold, hot = both(tmp_path, argv=["-m", "json.tool", "--help"])
    assert hot.returncode == cold.returncode == 0 and hot.stdout == cold.stdout


def test_an_entry_holding_a_preloaded_module_runs_cold(tmp_path):
    """A ``PYTHONPATH`` entry with its own ``numpy`` (the server imported one): that child is not forked
    from the server, it gets a server with that entry on its path or a fresh interpreter."""
    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("MINE = True\n")
    env = clean_env(PYTHONPATH=str(tmp_path), OMP_NUM_THREADS="1")
    proc = warm.run(sys.executable, ["-c", "import numpy; print(getattr(numpy, 'MINE', False))"], env, str(REPO), 120)
    assert proc.stdout.strip() == "True", proc.stderr


def test_timeout_kills_the_child(tmp_path):
    env = clean_env(OMP_NUM_THREADS="1")
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(sys.executable, ["-c", "import time; time.sleep(60)"], env, str(tmp_path), 1)
