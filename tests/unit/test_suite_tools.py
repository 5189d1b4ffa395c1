"""The suite's own tools keep their promises: ``--dist loadgroup`` (``.ci/run``) puts every test of one
``xdist_group`` on one worker. The contract batches (``tests/support/contract.py``) and the engine-core
runs rely on it; with pytest 9.2 + pytest-xdist 3.8 the groups were silently ignored (xdist writes
``item._nodeid``, which pytest 9.2 no longer reads) and each batch kept both workers busy."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

GROUPED = pathlib.Path(__file__).parent / "children" / "grouped_tests.py"


def test_loadgroup_keeps_a_group_on_one_worker(tmp_path):
    shutil.copy(GROUPED, tmp_path / "test_grouped.py")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {(tmp_path / f"w{k}").read_text() for k in range(6)}
    assert len(workers) == 1, f"one xdist_group ran on {sorted(workers)}"
