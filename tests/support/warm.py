"""Test children started from a warm interpreter: ``torch`` and the other heavy libraries that the shim
never patches are imported once, in a server process, and each child is a fork of it (what
``contract_child.py`` does for the contract cases, here for the scenario children).

Most of a scenario child's time is imports (ms-swift 4.6.0 GRPO on the stand-in: 20 of 26 s, torch
5 s of it). The server imports only :data:`PRELOAD`, none of which the shim hooks (``patches/__init__.py``
``INDEX``: vLLM, TRL, ms-swift, verl and ``transformers.trainer``; ``transformers`` itself is a lazy
module whose ``trainer`` submodule loads in the child). Everything the shim patches, the stand-in and
the release under test are imported by the child, after its own environment, ``sys.path``, ``cwd`` and
``argv`` are set, exactly as in a fresh interpreter.

A child runs warm only where that cannot change what it imports or how: same python; the variables
read at import time (:data:`IMPORT_ENV`) equal to the server's (one server per combination, a few per
test worker); no entry of its ``PYTHONPATH`` outside the server's holds a module the server already
imported (an overlay with its own ``transformers`` gets a server with that overlay on its path);
no interpreter options. Anything else, or ``SHIM_TEST_WARM=0``, runs a plain subprocess. The child
behaves as ``python -c CODE`` / ``python -m MOD`` / ``python SCRIPT``: ``sys.path[0]``, ``__main__``,
``SystemExit`` codes, an uncaught exception's traceback and exit 1, ``atexit`` handlers and non-daemon
threads at exit. Each server belongs to one test worker (its socket in that worker's temp dir).
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

PRELOAD = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "tokenizers")
"""Imported by the server where installed: none is a module the shim hooks, none looks at which other packages
are importable when it is imported (``transformers`` and ``accelerate`` do: which packages are available, an
NPU behind ``torch_npu``, are fixed at their import, so they stay the child's). ``deepspeed`` too where
``DS_ACCELERATOR=cpu`` fixes its accelerator."""
IMPORT_ENV = ("PYTORCH_", "TORCH_", "OMP_", "MKL_", "CUDA_", "DS_", "TOKENIZERS_", "LANG", "LC_")
"""Prefixes of the variables a preloaded library may read at import (the allocator settings among them): a
child runs warm only on a server whose values are its own."""
SERVERS_PER_WORKER = 4
"""Servers a test worker keeps (the least recently used one goes when another is needed)."""

_servers: dict = {}  # key -> Server (this test worker's)
_listing: dict = {}  # path entry -> its top-level names


def _import_env(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_ENV)))


def _names(entry: str) -> set:
    if entry not in _listing:
        try:
            names = {n.split(".")[0] for n in os.listdir(entry) if not n.endswith((".dist-info", ".egg-info"))}
        except OSError:
            names = set()
        _listing[entry] = names
    return _listing[entry]


class Server:
    def __init__(self, python: str, path: tuple, env: dict):
        self.python, self.path = python, path
        self.folder = tempfile.mkdtemp(prefix="warm-")
        self.sock = os.path.join(self.folder, "s")
        server_env = {k: v for k, v in env.items() if k.startswith(IMPORT_ENV) or k == "PATH"}
        server_env["PYTHONPATH"] = os.pathsep.join(path)
        self.proc = subprocess.Popen([python, __file__, "serve", self.sock], env=server_env,
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()  # the names it imported, once it listens
        if not line:
            raise RuntimeError(f"warm server for {python} did not start (exit {self.proc.wait()})")
        self.loaded = set(json.loads(line))

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def run(self, argv: list, env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
        folder = tempfile.mkdtemp(prefix="warm-run-")
        out, err, rc = (os.path.join(folder, n) for n in ("out", "err", "rc"))
        try:
            return self._run(argv, env, cwd, timeout, out, err, rc)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # the output is read into the result

    def _run(self, argv, env, cwd, timeout, out, err, rc) -> subprocess.CompletedProcess:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(self.sock)
            s.sendall(json.dumps({"argv": argv, "env": env, "cwd": cwd, "out": out, "err": err, "rc": rc}).encode()
                      + b"\n")
            pid = int(s.makefile().readline())
        deadline = time.monotonic() + timeout
        delay = 0.005
        while not os.path.exists(rc) and _alive(pid):  # the code is written last, right before the exit
            if time.monotonic() > deadline:
                _kill(pid)
                raise subprocess.TimeoutExpired(argv, timeout)
            time.sleep(delay)
            delay = min(0.05, delay * 2)
        code = int(open(rc).read()) if os.path.exists(rc) else -9  # no code written: killed
        return subprocess.CompletedProcess(argv, code, _read(out), _read(err))


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (the server reaps with SIGCHLD ignored, but be sure) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int) -> None:
    for target in (lambda: os.killpg(pid, 9), lambda: os.kill(pid, 9)):
        try:
            target()
        except OSError:
            pass


@atexit.register
def _close_all():
    for server in _servers.values():
        server.close()


def server_for(python: str, argv: list, env: dict) -> "Server | None":
    """This worker's server for a child, or None where it must run as a plain subprocess."""
    if os.environ.get("SHIM_TEST_WARM", "1") == "0" or os.name != "posix" or not argv or argv[0].startswith("-") \
            and argv[0] not in ("-c", "-m"):
        return None
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    key_env = _import_env(env)
    for key, server in list(_servers.items()):
        if key[0] == python and key[2] == key_env and server.proc.poll() is None:
            extra = [e for e in entries if e not in server.path]
            if not any(_names(e) & server.loaded for e in extra):
                _servers[key] = _servers.pop(key)  # most recently used last
                return server
    heavy = tuple(e for e in entries if _names(e) & (set(PRELOAD) | {"deepspeed"}))
    key = (python, heavy, key_env)
    while len(_servers) >= SERVERS_PER_WORKER or key in _servers:
        _servers.pop(key if key in _servers else next(iter(_servers))).close()
    try:
        server = _servers[key] = Server(python, heavy, env)
    except Exception:
        return None
    extra = [e for e in entries if e not in server.path]
    return None if any(_names(e) & server.loaded for e in extra) else server


def run(python: str, argv: list, env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """``python *argv`` with ``env`` in ``cwd``: warm where :func:`server_for` allows, else a subprocess."""
    argv = [str(a) for a in argv]
    server = server_for(str(python), argv, env)
    if server is not None:
        return server.run(argv, env, str(cwd), timeout)
    return subprocess.run([str(python), *argv], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


# ---------------------------------------------------------------------------
# the server (``python warm.py serve SOCKET``) and its children
# ---------------------------------------------------------------------------
def _serve(sock_path: str) -> None:
    import importlib
    import signal

    for name in PRELOAD + (("deepspeed",) if os.environ.get("DS_ACCELERATOR") == "cpu" else ()):
        try:
            importlib.import_module(name)
        except Exception:
            pass
    base_path = [p for p in sys.path if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    base_path = [p for p in base_path if p != os.path.dirname(os.path.abspath(__file__))]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(sock_path)
    srv.listen(8)
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})), flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            request = json.loads(conn.makefile().readline())
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                _child(request, base_path)  # never returns
            conn.sendall(f"{pid}\n".encode())


def _child(request: dict, base_path: list) -> None:
    import signal
    import threading
    import traceback

    code = 1
    me = os.getpid()
    real_exit = os._exit

    def finish(status: int):
        if os.getpid() == me:  # not a fork of the child's (vLLM engine cores, multiprocessing)
            with open(request["rc"] + ".tmp", "w") as fh:
                fh.write(str(status))
            os.replace(request["rc"] + ".tmp", request["rc"])
        real_exit(status)

    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        fd_in = os.open(os.devnull, os.O_RDONLY)
        fd_out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        fd_err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os._exit = lambda status: finish(status)
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *entries, *base_path]
        elif argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[:] = [os.getcwd(), *entries, *base_path]
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *entries, *base_path]
        try:
            import runpy

            if argv[0] == "-c":
                main = type(sys)("__main__")
                sys.modules["__main__"] = main
                exec(compile(argv[1], "<string>", "exec"), main.__dict__)
            elif argv[0] == "-m":
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            threading._shutdown()
        except Exception:
            pass
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        finish(code)


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    _serve(sys.argv[2])
