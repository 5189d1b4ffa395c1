"""The ``triton`` digest route (the one the H200 runs) equals the definition, on the CPU through
Triton's interpreter (the H200 machine's Triton, installed by ``tests.support.envs triton``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.envs import triton_path
from tests.support.helpers import REPO, clean_env

SCENARIO = REPO / "tests" / "scenarios" / "digest_triton_run.py"


def test_triton_route_equals_the_definition_in_one_launch_per_kind():
    env = clean_env(TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(triton_path()), str(REPO)]))
    proc = subprocess.run([sys.executable, str(SCENARIO)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    wrong = [r for r in out["rows"] if not r[2]]
    assert not wrong, wrong
    assert len(out["rows"]) == 20
    # per dtype: one launch for the 2-byte pieces and one for the float32 ones (CAST 0, and 1 or 2)
    assert out["launches"] == {"0": 2, "1": 1, "2": 1}, out["launches"]
