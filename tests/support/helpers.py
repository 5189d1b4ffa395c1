"""Shared helpers: run Python code in a fresh interpreter with a chosen path/env."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TOY_SITE = DATA / "toy_site"

_SHIM_VARS = ("SHIM_DISABLED", "SHIM_DISABLED_PATCHES", "SHIM_STRICT", "SHIM_DEBUG", "SHIM_TRACE",
              "SHIM_VERIFY_WEIGHTS")


def stand_in_site_dir(name: str) -> Path:
    """``.envs/<name>``, a site dir of links into THIS checkout's ``tests/fakevllm``. Where ``.envs`` is
    shared with another checkout (a git worktree's ``.envs`` linked to the main one's) and the site there
    links into that checkout, this checkout's own: ``.envs/<name>-<hash of this checkout's path>``."""
    import hashlib

    target = REPO / ".envs" / name
    vllm = target / "vllm"
    if os.path.lexists(vllm) and os.path.realpath(vllm) != os.path.realpath(REPO / "tests" / "fakevllm" / "vllm"):
        target = target.with_name(f"{name}-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}")
    return target


def clean_env(**extra: str) -> dict:
    """The current environment without any SHIM_* switch, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _SHIM_VARS and not k.startswith("SHIM_") and k != "PYTHONPATH"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def shim_venv(env_dir: Path, *paths: str) -> "tuple[str, str]":
    """A fresh virtual environment (no pip) whose site-packages puts the repository, the shim's two runtime
    deps (packaging, wrapt, taken from this environment) and ``paths`` on sys.path through a ``.pth`` file
    (no install); ``(its python, its site-packages)``."""
    import venv

    import packaging
    import wrapt

    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(Path(env_dir) / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = {os.path.dirname(os.path.dirname(m.__file__)) for m in (packaging, wrapt)}
    with open(os.path.join(site, "aaa_deps.pth"), "w") as f:
        f.write("\n".join([str(REPO), *deps, *paths]) + "\n")
    return py, site


def run_python(code: str, path: list | tuple = (), env: dict | None = None, args: list | tuple = (),
               timeout: int = 600, check: bool = True, fresh: bool = False,
               argv: list | tuple = ()) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter with ``path`` first on PYTHONPATH (then the repo): a warm one
    (``tests/support/warm.py``: torch and a few more already imported), or with ``fresh`` a cold one (a
    test of what an import pulls in). ``args`` are interpreter options (before ``-c``), ``argv`` the
    program's own arguments (``sys.argv[1:]``), e.g. the text of a child file and its parameters:
    ``run_python(CHILD.read_text(), argv=[json.dumps(spec)])``."""
    env = clean_env() if env is None else dict(env)
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [str(REPO)])
    from tests.support import warm

    if fresh:
        proc = subprocess.run([sys.executable, *args, "-c", code, *argv], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=str(REPO))
    else:
        proc = warm.run(sys.executable, [*args, "-c", code, *argv], env, str(REPO), timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")
    return proc


def child_text(body) -> str:
    """The text of a child program's part: a child file (a ``Path``), several in order (a tuple of them: a
    shared part first), or an inline snippet (a ``str``, dedented)."""
    if isinstance(body, str):
        return textwrap.dedent(body)
    return "".join(Path(part).read_text() for part in ((body,) if isinstance(body, Path) else body))


def last_json(proc: subprocess.CompletedProcess):
    """The last stdout line that parses as JSON (what the child printed as its result)."""
    for line in reversed(proc.stdout.splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no JSON result in stdout:\n{proc.stdout}\nSTDERR:\n{proc.stderr}")


_PORT_SLICE = 3000  # ports per pytest-xdist worker, from 20000 up: four workers stay below 32768
_port_state: list = []  # [first port of this worker's slice, next offset in it]


def rendezvous_port() -> str:
    """A TCP port for a child's torch.distributed rendezvous (MASTER_PORT / --master_port).

    Below Linux's ephemeral range (32768-60999): no outgoing connection (gloo's, pip's, another
    test worker's) is ever handed it between this check and the child's listen -- the race that
    picking a port with ``bind(0)`` loses now and then (EADDRINUSE in CI). Each pytest-xdist worker
    has its own slice and each call takes the next port in it, so no port a finished child may
    still hold in TIME_WAIT comes back."""
    if not _port_state:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
        base = 20000 + (int(worker) % 4 if worker.isdigit() else 0) * _PORT_SLICE
        _port_state.extend([base, os.getpid() % 1000])  # a rerun starts elsewhere in the slice
    base = _port_state[0]
    for _ in range(_PORT_SLICE):
        port = base + _port_state[1] % _PORT_SLICE
        _port_state[1] += 1
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return str(port)
    raise AssertionError(f"no free rendezvous port in {base}-{base + _PORT_SLICE - 1}")
