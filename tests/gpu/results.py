"""Where the GPU tests get their numbers: the JSON that bench/gpu_*.py write.

With ``SHIM_GPU_RESULTS=DIR`` (what tests/gpu/run_all.sh sets) the tests read
``DIR/gpu_*.json`` and never start a run (a run missing there, e.g. skipped at
the deadline, skips its tests with that reason). Without it, a test module runs
its benchmark once into a temporary folder: TRL releases come from
``SHIM_GPU_TRL_PATHS`` (``1.9.2=DIR,1.10.0=DIR``) or are installed into .envs/.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.gpu import common


def load(name: str, tmp_path_factory, *bench_args: str) -> dict:
    folder = os.environ.get(common.RESULTS_ENV)
    if folder:
        path = os.path.join(folder, f"{name}.json")
        data = common.read_json(path)
        if data is None:
            pytest.skip(f"no {path} ({common.RESULTS_ENV} is set: the tests do not run benchmarks)")
        return data
    out = tmp_path_factory.mktemp(name) / f"{name}.json"
    trl = [f"--trl-path={spec}" for spec in os.environ.get("SHIM_GPU_TRL_PATHS", "").split(",") if spec]
    if name == "gpu_sleep_memory":
        trl = []
    cmd = [sys.executable, str(common.REPO / "bench" / f"{name}.py"), "--out", str(out),
           "--workdir", str(out.parent / "work"), *trl, *bench_args]
    proc = subprocess.run(cmd, cwd=str(common.REPO), capture_output=True, text=True, timeout=1800)
    data = common.read_json(out)
    if data is None:
        pytest.fail(f"{' '.join(cmd)} wrote no results (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-3000:]}")
    return data


def run_of(data: dict, label: str) -> dict:
    r = (data.get("runs") or {}).get(label)
    if r is None:
        pytest.skip(f"run {label!r} was not made")
    if r.get("skipped"):
        pytest.skip(f"run {label!r}: {r['skipped']}")
    if r.get("error") or not (r.get("metrics") or r.get("sleeps")):
        pytest.fail(f"run {label!r} failed: {r.get('error')}")
    return r
