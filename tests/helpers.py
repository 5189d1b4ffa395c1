"""Shared helpers: run Python code in a fresh interpreter with a chosen path/env."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
TOY_SITE = DATA / "toy_site"

_SHIM_VARS = ("SHIM_DISABLED", "SHIM_DISABLED_PATCHES", "SHIM_STRICT", "SHIM_DEBUG", "SHIM_TRACE")


def clean_env(**extra: str) -> dict:
    """The current environment without any SHIM_* switch, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _SHIM_VARS and k != "PYTHONPATH"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_python(code: str, path: list | tuple = (), env: dict | None = None, args: list | tuple = (),
               timeout: int = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter with ``path`` first on PYTHONPATH (then the repo)."""
    env = clean_env() if env is None else dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [str(REPO)])
    proc = subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO))
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def last_json(proc: subprocess.CompletedProcess):
    """The last stdout line that parses as JSON (what the child printed as its result)."""
    for line in reversed(proc.stdout.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON result in stdout:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
