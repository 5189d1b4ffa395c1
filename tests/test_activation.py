"""The three ways in: ``import shim.auto``, ``python -m shim CMD``, ``python -m shim install``."""
import json
import os
import subprocess
import sys
import venv

from tests.helpers import DATA, REPO, clean_env, rendezvous_port, run_python

PROBE = "import json, os, shim; print(json.dumps({'active': shim.is_active(), 'pid': os.getpid()}))"


def shim_run(args, env=None, **kw):
    env = clean_env() if env is None else env
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "shim", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(REPO), **kw)


def test_import_auto_imports_no_upstream():
    proc = run_python("import sys, shim.auto, shim\n"
                      "heavy = [m for m in ('torch', 'transformers', 'trl', 'vllm', 'swift', 'deepspeed') if m in sys.modules]\n"
                      "print(shim.is_active(), heavy)")
    assert proc.stdout.strip() == "True []"


def test_disabled_env_turns_auto_off():
    proc = run_python("import shim.auto, shim; print(shim.is_active())", env=clean_env(SHIM_DISABLED="1"))
    assert proc.stdout.strip() == "False"


def test_run_reaches_child_and_grandchild():
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}], check=True); exec({PROBE!r})"
    proc = shim_run([sys.executable, "-c", grandchild])
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(results) == 2 and all(r["active"] for r in results)
    assert results[0]["pid"] != results[1]["pid"]


def test_run_chains_user_sitecustomize():
    env = clean_env(PYTHONPATH=str(DATA / "user_site"))
    proc = shim_run([sys.executable, "-c", "import os, shim; print(shim.is_active(), os.environ.get('USER_SITECUSTOMIZE_RAN'))"], env=env)
    assert proc.stdout.strip() == "True 1", proc.stderr


def test_run_python_dash_S_disables():
    proc = shim_run([sys.executable, "-S", "-c", "import sys; print('shim' in sys.modules)"])
    assert proc.stdout.strip() == "False", proc.stderr


def test_run_missing_command_exits_127():
    proc = shim_run(["no-such-command-xyz", "arg"])
    assert proc.returncode == 127
    assert proc.stderr.strip() == "shim: command not found: no-such-command-xyz"


def test_run_no_command_usage_exit_2():
    proc = shim_run([])
    assert proc.returncode == 2 and "COMMAND" in proc.stderr
    proc = shim_run(["--strict"])
    assert proc.returncode == 2 and "COMMAND" in proc.stderr


def test_run_bad_switch_exit_2_nothing_started():
    proc = shim_run(["--disable", "nope", sys.executable, "-c", "print('started')"])
    assert proc.returncode == 2 and "started" not in proc.stdout
    assert proc.stderr.count("\n") == 1 and "SHIM_DISABLED_PATCHES" in proc.stderr


def test_run_reaches_every_torchrun_rank(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(
        "import json, os, shim, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "t = __import__('torch').tensor([1 if shim.is_active() else 0])\n"
        "dist.all_reduce(t)\n"
        # one file per rank: two ranks printing to one pipe can interleave their lines
        "open(os.path.join(os.environ['OUT_DIR'], f'rank{dist.get_rank()}.json'), 'w').write(\n"
        "    json.dumps({'rank': dist.get_rank(), 'active': shim.is_active(), 'active_ranks': int(t)}))\n"
        "dist.destroy_process_group()\n"
    )
    out_dir = tmp_path / "ranks"
    out_dir.mkdir()
    port = rendezvous_port()
    proc = shim_run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), str(script)],
                    env=clean_env(OUT_DIR=str(out_dir)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted((json.loads(p.read_text()) for p in out_dir.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["active"] and r["active_ranks"] == 2 for r in results)


def test_install_uninstall_fresh_venv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import packaging, wrapt  # the shim's two runtime deps, taken from this environment
    deps = {os.path.dirname(os.path.dirname(m.__file__)) for m in (packaging, wrapt)}
    with open(os.path.join(site, "aaa_deps.pth"), "w") as f:
        f.write("\n".join([str(REPO), *deps]) + "\n")
    env = clean_env()
    check = [py, "-c", "import sys, shim; print('shim' in sys.modules and shim.is_active())"]
    assert subprocess.run(check, env=env, capture_output=True, text=True).stdout.strip() == "False"
    out = subprocess.run([py, "-m", "shim", "install"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "vllm_sleep_shim.pth" in out.stdout
    assert os.path.exists(os.path.join(site, "vllm_sleep_shim.start"))
    assert subprocess.run(check, env=env, capture_output=True, text=True).stdout.strip() == "True"
    assert subprocess.run(check, env=clean_env(SHIM_DISABLED="1"), capture_output=True, text=True).stdout.strip() == "False"
    out = subprocess.run([py, "-m", "shim", "uninstall"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "removed" in out.stdout
    assert subprocess.run(check, env=env, capture_output=True, text=True).stdout.strip() == "False"
    assert not os.path.exists(os.path.join(site, "vllm_sleep_shim.pth"))
