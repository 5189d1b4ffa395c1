"""``ray-cluster-workers``: a driver under the shim gives its job's actors the shim on a cluster started with
``ray start`` (issue 30 item 4), without an install on the node.

One real cluster per module: ``ray start --head --block`` on loopback (ray 2.49.2 of the verl envs), its own temp
dir and ports, one CPU, no dashboard, no prestarted workers, run by an interpreter that has ci-venv's packages
but NOT the shim (a venv of the base interpreter: ci-venv's editable install of the shim would make it importable
on the "node"), and without the shim on ``PYTHONPATH`` (asserted on the raylet's environment). The drivers run
from a scratch directory (Ray puts the driver's working directory on its workers' path). Teardown: SIGTERM to
``ray start`` (it stops its processes), then SIGKILL to its process group and to any process whose command line
names the cluster's temp dir: nothing of the cluster outlives the module.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.support.helpers import REPO, clean_env, last_json, rendezvous_port

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (2 shared cores)

DRIVER = REPO / "tests" / "patches" / "ray_cluster" / "children" / "driver.py"
ID = "ray-cluster-workers"


def _node_python(root: str) -> str:
    """A node's interpreter without the shim and without wrapt (its dependency, which a node without the shim may
    well lack): a venv of the base interpreter whose path has the verl envs' packages (ray) and a folder linking
    every entry of ci-venv's site-packages but wrapt (no .pth file of ci-venv runs: not its editable shim)."""
    import sysconfig

    from tests.support.envs import verl_deps_path

    venv = os.path.join(root, "node")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", venv], check=True, capture_output=True)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    packages = os.path.join(root, "node-packages")
    os.makedirs(packages)
    ours = sysconfig.get_paths()["purelib"]
    for name in os.listdir(ours):
        if not name.startswith(("wrapt", "shim", "__editable__", "vllm_sleep_shim")):
            os.symlink(os.path.join(ours, name), os.path.join(packages, name))
    with open(os.path.join(site, "test_node.pth"), "w") as f:
        f.write(f"{verl_deps_path()}\n{packages}\n")
    return python


def _ours(root: str, program: str = "") -> list:
    """Pids of the processes whose command line names ``root`` (the cluster's temp dir is in every one of them) and,
    given ``program``, whose executable's name is that."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if any(root.encode() in arg for arg in argv) and (not program or os.path.basename(argv[0]) == program.encode()):
            found.append(int(entry))
    return found


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)


@pytest.fixture(scope="module")
def cluster():
    root = tempfile.mkdtemp(prefix="shim-rc-", dir="/tmp")  # unix socket paths under it stay short
    proc = None
    try:
        python = _node_python(root)
        port = rendezvous_port()
        ports = {"--port": port,  # no Ray Client server: the minimal ray of the verl envs has no grpcio
                 "--node-manager-port": rendezvous_port(), "--object-manager-port": rendezvous_port(),
                 "--dashboard-agent-listen-port": rendezvous_port(), "--dashboard-agent-grpc-port": rendezvous_port(),
                 "--runtime-env-agent-port": rendezvous_port(), "--metrics-export-port": rendezvous_port()}
        env = clean_env(RAY_USAGE_STATS_ENABLED="0", RAY_prestart_worker_first_driver="0",
                        RAY_enable_worker_prestart="0", OMP_NUM_THREADS="1")
        env.pop("RAY_ADDRESS", None)
        log = open(os.path.join(root, "ray-start.log"), "w")
        proc = subprocess.Popen(
            [python, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={root}/ray",
             *[f"{k}={v}" for k, v in ports.items()]],
            env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        address = f"127.0.0.1:{port}"
        raylet = None
        deadline = time.monotonic() + 90
        while raylet is None:
            assert proc.poll() is None and time.monotonic() < deadline, open(log.name).read()[-3000:]
            time.sleep(0.5)
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", int(port))) != 0:
                    continue
            raylet = next(iter(_ours(root, "raylet")), None)
        node_env = _environ(raylet)
        assert b"shim" not in node_env.get(b"PYTHONPATH", b"") and str(REPO).encode() not in \
            node_env.get(b"PYTHONPATH", b""), node_env.get(b"PYTHONPATH")
        missing = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('shim'), "
                                  "u.find_spec('wrapt'), u.find_spec('ray') is not None)"],
                                 env=env, cwd=root, capture_output=True, text=True)
        assert missing.stdout.split() == ["None", "None", "True"], (missing.stdout, missing.stderr)
        user = os.path.join(root, "userpkg")  # the user's own py_modules entry, with a setup hook
        os.makedirs(user)
        with open(os.path.join(user, "__init__.py"), "w") as f:
            f.write("import os\n\n\ndef setup():\n    os.environ['TEST_USER_HOOK'] = 'string'\n")
        scratch = os.path.join(root, "driver")
        os.makedirs(scratch)
        yield {"address": address, "root": root, "python": python, "user_module": user, "cwd": scratch}
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        for _ in range(2):
            for pid in _ours(root):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        shutil.rmtree(root, ignore_errors=True)


def drive(cluster, launcher: str, hook: str, own_py_modules: bool = False, **switches) -> tuple:
    """Run ``children/driver.py`` under ``launcher`` (``auto``: ``import shim.auto``; ``-m shim``: ``python -m
    shim python driver.py``) against ``cluster`` with the shim's ``switches`` in its environment."""
    from tests.support.envs import verl_deps_path

    spec = {"auto": launcher == "auto", "hook": hook, "user_module": cluster["user_module"],
            "own_py_modules": own_py_modules}
    env = clean_env(**switches, PYTHONPATH=os.pathsep.join([str(verl_deps_path()), str(REPO)]),
                    RAY_ADDRESS=cluster["address"],  # the driver's ``ray.init(address="auto")``: this cluster only
                    RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1")
    prefix = [sys.executable] if launcher == "auto" else [sys.executable, "-m", "shim", sys.executable]
    proc = subprocess.run([*prefix, str(DRIVER), json.dumps(spec)], env=env, cwd=cluster["cwd"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"
    return last_json(proc), proc.stderr


def shipped(report: dict, cluster) -> bool:
    """The actor's shim is the copy Ray unpacked from the job's py_modules (not the repository's)."""
    return "runtime_resources" in report["file"] and report["file"].startswith(cluster["root"])


def test_import_shim_auto_driver_gives_its_actors_the_shim_with_its_switches_and_the_users_runtime_env(cluster):
    """``import shim.auto`` in the driver: the actor (another process, a child of the raylet) has the shim active
    (its own record decided there, the driver's disable list obeyed), the driver's switches, the user's callable
    setup hook run, the user's env_vars (winning over the driver's value of the same switch) and py_modules.
    An actor whose own runtime_env replaces the job's py_modules still starts and runs the user's hook (no shim)."""
    r, err = drive(cluster, "auto", "callable", own_py_modules=True, SHIM_DISABLED_PATCHES="trl-stale-weights",
                   SHIM_VERIFY_WEIGHTS="1", SHIM_SUMMARY_EVERY="3")
    actor = r["actor"]
    assert actor["pid"] != r["driver_pid"], r
    assert actor["active"] and shipped(actor, cluster), actor
    assert actor["decisions"][ID] == "applied" and actor["decisions"]["trl-stale-weights"] == "disabled", actor
    assert f"{os.sep}shim{os.sep}_vendor{os.sep}wrapt{os.sep}" in (actor["wrapt"] or ""), actor  # the node has none
    assert json.loads(actor["child"]) == {"active": True, "wrapt": True, "verify": "1"}, actor  # vLLM's core, say
    assert actor["env"] == {"SHIM_DISABLED_PATCHES": "trl-stale-weights", "SHIM_VERIFY_WEIGHTS": "1",
                            "SHIM_SUMMARY_EVERY": "7", "SHIM_STRICT": None, "TEST_USER_VAR": "kept",
                            "TEST_USER_HOOK": "callable"}, actor
    assert actor["user_module"], actor
    own = r["own_py_modules"]  # Ray replaces the job's py_modules by the actor's: no shim there, nothing broken
    assert not own["active"] and not own["importable"] and own["user_module"], own
    assert own["env"]["TEST_USER_HOOK"] == "callable" and own["env"]["TEST_USER_VAR"] == "kept", own


def test_python_m_shim_driver_gives_its_actors_the_shim_and_without_the_record_they_have_none(cluster):
    """``python -m shim`` driver with the user's string setup hook (a function of the user's own py_modules): the
    actor has the shim, the hook ran. The same job with ``ray-cluster-workers`` disabled: the actor has no shim
    (not even importable: the node has none), which is the bug; the user's runtime_env is as before."""
    r, err = drive(cluster, "-m shim", "string")
    actor = r["actor"]
    assert actor["pid"] != r["driver_pid"], r
    assert actor["active"] and shipped(actor, cluster) and actor["decisions"][ID] == "applied", actor
    assert actor["env"]["TEST_USER_HOOK"] == "string" and actor["env"]["TEST_USER_VAR"] == "kept", actor
    assert actor["user_module"], actor

    off, err = drive(cluster, "-m shim", "string", SHIM_DISABLED_PATCHES=ID)
    actor = off["actor"]
    assert not actor["active"] and not actor["importable"], actor
    assert actor["env"]["SHIM_DISABLED_PATCHES"] is None, actor  # nothing of the shim's reached it
    assert actor["env"]["TEST_USER_HOOK"] == "string" and actor["env"]["TEST_USER_VAR"] == "kept", actor
    assert actor["user_module"], actor
