"""What a Ray worker of a joined cluster gets from ``shim.ray.cluster`` besides the shim itself, without a cluster:
the shipped package (``package``) on the worker's path, the setup hook run in a fresh interpreter, as Ray runs it.

- A node that has its own ``wrapt``: the hook never puts the shipped copy before it, neither in the worker nor in
  the processes the worker starts (``PYTHONPATH`` precedes site-packages there: vLLM's engine core would import
  the driver's ``wrapt`` instead of the node's).
- A driver started by the launcher, which warned already about an unknown id of ``SHIM_DISABLED_PATCHES``: the
  job's workers (the runtime_env's ``env_vars``) do not print that WARNING once per actor again.
"""
import json
import os
import subprocess
import sys

from shim.ray import cluster
from tests.support.helpers import clean_env


def _worker(code: str, env: dict, path: str) -> subprocess.CompletedProcess:
    """A fresh interpreter with ``path`` first on its path and ``env`` as Ray gives a worker its job's env_vars."""
    env = {**{k: v for k, v in clean_env().items() if not k.startswith(("SHIM_", "_SHIM_"))}, **env,
           "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=path)


def test_a_nodes_own_wrapt_is_never_shadowed_by_the_shipped_one(tmp_path):
    shipped = cluster.package(str(tmp_path))
    assert os.path.isdir(os.path.join(shipped, cluster.VENDOR, "wrapt"))
    code = ("import json, os, subprocess, sys\nimport shim\nfrom shim.ray.cluster import setup_hook\n"
            "setup_hook()()\n"
            "child = subprocess.run([sys.executable, '-c', 'import wrapt; print(wrapt.__file__)'],"
            " capture_output=True, text=True).stdout.strip()\n"
            "import wrapt\n"
            "print(json.dumps({'shim': shim.__file__, 'active': shim.is_active(), 'wrapt': wrapt.__file__,"
            " 'child': child}))")
    proc = _worker(code, {}, str(tmp_path))  # ci-venv has wrapt: the node's own
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shim"].startswith(shipped) and out["active"], out  # the shipped copy, activated by the hook
    vendor = os.path.join(shipped, cluster.VENDOR)
    assert not out["wrapt"].startswith(vendor) and not out["child"].startswith(vendor), out


def test_workers_of_a_launched_driver_do_not_repeat_the_launchers_warning(monkeypatch):
    """The launcher (``python -m shim``) sets ``_SHIM_DISABLED_PATCHES_REPORTED`` for its command; a driver under
    it joining a cluster hands its switches to the job's workers, which must stay as silent as its own children."""
    monkeypatch.setenv("SHIM_DISABLED_PATCHES", "trl-stale-weight")  # a typo of trl-stale-weights
    monkeypatch.setenv("_SHIM_DISABLED_PATCHES_REPORTED", "trl-stale-weight")
    env_vars = cluster.merged({"env_vars": {"A": "1"}}, "/staging/shim")["env_vars"]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = _worker("import shim.auto, shim; print(shim.is_active())", env_vars, repo)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert "trl-stale-weight'" not in proc.stderr, proc.stderr
    own = _worker("import shim.auto", {"SHIM_DISABLED_PATCHES": "trl-stale-weight"}, repo)  # the failing half
    assert "'trl-stale-weight'" in own.stderr and "WARNING" in own.stderr, own.stderr


def test_every_switch_the_driver_set_reaches_the_jobs_workers(monkeypatch):
    """Each ``SHIM_*`` switch (the trace file above all: an actor's sleeps and wakes belong in the driver's
    trace) goes into the job's env_vars; one the driver did not set stays out, and the user's value wins."""
    from shim.engine import config

    values = {config.SHIM_TRACE: "/shared/trace.jsonl", config.SHIM_SLEEP_LEVEL: "2", config.SHIM_DEBUG: "1",
              config.SHIM_STALE_ALARM: "0.1", config.SHIM_DEVICE_CHECK_EVERY: "5", config.SHIM_STRICT: "0",
              config.SHIM_VERIFY_WEIGHTS: "sample", config.SHIM_SUMMARY_EVERY: "3",
              config.SHIM_DISABLED_PATCHES: "trl-stale-weights"}
    for name in config.ALL:
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    env_vars = cluster.merged({"env_vars": {config.SHIM_DEBUG: "0"}}, "/staging/shim")["env_vars"]
    assert env_vars == {**values, config.SHIM_DEBUG: "0"}, env_vars
