"""The three ways in: ``import shim.auto``, ``python -m shim CMD``, ``python -m shim install``."""
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.helpers import DATA, REPO, clean_env, rendezvous_port, run_python, shim_venv

PROBE = "import json, os, shim; print(json.dumps({'active': shim.is_active(), 'pid': os.getpid()}))"


def shim_run(args, env=None, **kw):
    env = clean_env() if env is None else env
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-m", "shim", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(REPO), **kw)


# Every module ``import shim.auto`` may import in a fresh interpreter: each one is paid at the start of
# every interpreter after ``python -m shim install``, every Ray worker, every spawned engine core (goal:
# under 3 ms added, bench/import_overhead.py). A name outside this list is a start-up regression
# (``from typing import TYPE_CHECKING`` added ``typing``, ``re``, ``collections``...: 13 ms; ``importlib.util``
# 3 ms): measure it with the bench before adding it here. Nothing of torch/trl/vllm, nor wrapt (~60 ms).
AUTO_IMPORTS = {
    "__future__",
    "shim", "shim.auto", "shim.patches",
    "shim.engine", "shim.engine.catalog", "shim.engine.config", "shim.engine.hooks", "shim.engine.log",
    "shim.engine.patch", "shim.engine.patcher", "shim.engine.probes", "shim.engine.registry",
}
AUTO_PROBE = ("import json, sys\n"
              "before = set(sys.modules)\n"
              "import shim.auto, shim\n"
              "print(json.dumps({'active': shim.is_active(), 'before': sorted(before),\n"
              "                  'new': sorted(set(sys.modules) - before)}))")


@pytest.mark.parametrize("python", ["this", "bare-venv"])
def test_import_auto_imports_only_the_listed_modules(python, tmp_path):
    """The SET of modules a fresh ``python -c "import shim.auto"`` adds to ``sys.modules`` is
    :data:`AUTO_IMPORTS` (less what the interpreter's start imported already), with no SHIM switch set.
    Twice: the test's interpreter, and a bare venv of its base Python (nothing in site-packages), where no
    ``.pth`` of an installed package has imported ``importlib.util`` or ``re`` first and hides them."""
    exe = sys.executable
    if python == "bare-venv":
        venv.create(tmp_path / "venv", with_pip=False, symlinks=os.name != "nt")
        exe = str(tmp_path / "venv" / ("Scripts" if os.name == "nt" else "bin") / "python")
    proc = subprocess.run([exe, "-c", AUTO_PROBE], env=clean_env(PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["active"], proc.stderr
    heavy = [m for m in ("torch", "transformers", "trl", "vllm", "swift", "deepspeed", "wrapt") if m in got["new"]]
    assert heavy == []
    new, expected = set(got["new"]), AUTO_IMPORTS - set(got["before"])
    assert new == expected, f"imported beyond the list: {sorted(new - expected)}; listed, not imported: {sorted(expected - new)}"


def test_disabled_env_turns_auto_off():
    proc = run_python("import os, shim.auto, shim; print(shim.is_active(), shim.bootstrap_dir() in os.environ['PYTHONPATH'])",
                      env=clean_env(SHIM_DISABLED="1"))
    assert proc.stdout.strip() == "False False"  # nor are its children reached


def test_auto_puts_the_bootstrap_first_on_pythonpath_for_children(monkeypatch):
    """What ``import shim.auto`` leaves for the processes it starts (a spawned engine core: the scenario is
    tests/patches/vllm_sleep_guard/test_engine_core.py): the bootstrap first, the user's entries unchanged after
    it, no empty entry (the current directory) added, nothing added twice."""
    import shim

    boot = shim.bootstrap_dir()
    assert (Path(boot) / "sitecustomize.py").is_file() and os.listdir(boot) in (["sitecustomize.py"],
                                                                                ["sitecustomize.py", "__pycache__"],
                                                                                ["__pycache__", "sitecustomize.py"])
    for before, after in ((None, boot), ("", boot), ("a" + os.pathsep + os.pathsep + "b", os.pathsep.join([boot, "a", "", "b"])),
                          (os.pathsep.join(["x", boot]), os.pathsep.join(["x", boot]))):
        if before is None:
            monkeypatch.delenv("PYTHONPATH", raising=False)
        else:
            monkeypatch.setenv("PYTHONPATH", before)
        shim._reach_children()
        shim._reach_children()
        assert os.environ["PYTHONPATH"] == after, before


def test_run_reaches_child_and_grandchild():
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {PROBE!r}], check=True); exec({PROBE!r})"
    proc = shim_run([sys.executable, "-c", grandchild])
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(l) for l in proc.stdout.splitlines()]
    assert len(results) == 2 and all(r["active"] for r in results)
    assert results[0]["pid"] != results[1]["pid"]


def test_run_chains_user_sitecustomize():
    env = clean_env(PYTHONPATH=str(DATA / "user_site"))
    # evidence from inside the child: its own pid, set by the user's file in that process
    proc = shim_run([sys.executable, "-c", "import os, sys, shim; "
                     "print(shim.is_active(), getattr(sys, 'user_sitecustomize_pid', None) == os.getpid())"], env=env)
    assert proc.stdout.strip() == "True True", proc.stderr


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
    proc = shim_run(["--strict", sys.executable, "-c", "print('started')"], env=clean_env(SHIM_DEBUG="maybe"))
    assert proc.returncode == 2 and "started" not in proc.stdout
    assert proc.stderr.count("\n") == 1 and "SHIM_DEBUG" in proc.stderr


def test_run_unknown_disabled_id_warns_and_runs():
    code = "import shim; from shim.engine import registry; print(shim.is_active(), registry.decisions()['trl-stale-weights'].decision)"
    proc = shim_run(["--disable", "nope", sys.executable, "-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "True waiting", proc.stderr
    assert proc.stderr.count("nope") == 1 and "no known id resembles it" in proc.stderr, proc.stderr


def test_unknown_disabled_id_is_one_short_warning_naming_the_close_ids():
    """Issue 29 item 4: a mistyped id was 1,799 characters listing every id, printed by the launcher AND
    again by COMMAND. Now one line under 200 characters naming the id meant, once per run: COMMAND and
    its children stay silent about what the launcher said (a child's own activation still warns)."""
    env = clean_env(SHIM_DISABLED_PATCHES="trl-stale-weight")
    proc = shim_run([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'])"],
                    env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "SHIM_DISABLED_PATCHES" in line]
    assert len(lines) == 1, proc.stderr  # launcher, child and grandchild: one WARNING
    assert len(lines[0]) < 200 and "'trl-stale-weight'" in lines[0] and "trl-stale-weights" in lines[0], lines
    assert "vllm-level2-tensors" not in lines[0]  # not every id
    direct = run_python("import shim.auto", env=clean_env(SHIM_DISABLED_PATCHES="trl-stale-weight"))
    assert direct.stderr.count("WARNING") == 1 and "trl-stale-weights" in direct.stderr, direct.stderr


def test_mistyped_subcommand_is_a_suggestion_not_command_not_found(tmp_path):
    proc = shim_run(["stauts"])
    assert proc.returncode == 2 and proc.stderr.strip() == "shim: unknown command 'stauts'; did you mean 'status'?", proc.stderr
    assert shim_run(["docter", "-v"]).stderr.strip() == "shim: unknown command 'docter'; did you mean 'doctor'?"
    assert shim_run(["no-such-command-xyz"]).returncode == 127  # nothing like a subcommand: not found, as before
    program = tmp_path / "statu"  # a real program named like a subcommand still runs
    program.write_text("#!/bin/sh\necho ran statu\n")
    program.chmod(0o755)
    env = clean_env(PATH=f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    ran = shim_run(["statu"], env=env)
    assert ran.returncode == 0 and ran.stdout.strip() == "ran statu", ran.stderr
    assert shim_run(["--", "stauts"]).returncode == 127  # after --: a command, never a subcommand


def test_python_OO_launcher_and_auto(tmp_path):
    env = clean_env(PYTHONPATH=str(REPO))
    help_ = subprocess.run([sys.executable, "-OO", "-m", "shim", "--help"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert help_.returncode == 0 and "COMMAND" in help_.stdout, help_.stderr
    proc = subprocess.run([sys.executable, "-OO", "-m", "shim", sys.executable, "-OO", "-c", "import shim; print(shim.is_active())"],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    status = subprocess.run([sys.executable, "-OO", "-m", "shim", "status", "--all"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert status.returncode == 0 and "trl-stale-weights" in status.stdout, status.stderr


def test_user_patches_package_beside_the_script(tmp_path):
    """A training repo with its own ``patches/`` package (and a ``patches.py`` elsewhere on the path):
    the shim works, and the user's ``import patches`` gets the user's, also after activation."""
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "__init__.py").write_text("MINE = True\nALL = 'not a list of patches'\n")
    (tmp_path / "train.py").write_text(
        "import json, shim.auto, shim\nimport patches\nfrom shim.engine import catalog\n"
        "print(json.dumps({'active': shim.is_active(), 'mine': getattr(patches, 'MINE', False),"
        " 'ids': len(catalog.all_patches())}))\n")
    env = clean_env(PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "train.py"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["active"] and out["mine"] and out["ids"] >= 15
    launched = subprocess.run([sys.executable, "-m", "shim", sys.executable, "train.py"], env=env, capture_output=True,
                              text=True, cwd=tmp_path)
    assert launched.returncode == 0 and json.loads(launched.stdout.strip().splitlines()[-1]) == out, launched.stderr


def test_console_script_is_not_shadowed_by_a_shim_py(tmp_path):
    """``python -m shim`` in a directory with a ``shim.py`` runs that file (Python puts the working
    directory first); the ``vllm-sleep-shim`` console script and the bootstrap in the child do not."""
    script = os.path.join(os.path.dirname(sys.executable), "vllm-sleep-shim")
    assert os.path.exists(script), "tests need the package installed (pip install -e .)"
    (tmp_path / "shim.py").write_text("print('USER SHIM.PY')\n")
    code = "import shim; print(shim.is_active(), hasattr(shim, 'activate'))"
    proc = subprocess.run([script, sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "True True", proc.stdout + proc.stderr


def test_status_when_disabled_says_so():
    proc = shim_run(["status", "--json"], env=clean_env(SHIM_DISABLED="1"))
    rows = json.loads(proc.stdout)
    assert rows and all(r["decision"] == "disabled" and r["reason"] == "SHIM_DISABLED=1" for r in rows)


def test_doctor_affected_trl_without_always_on_exits_1():
    from tests.support import stand_in
    from tests.support.envs import trl_path

    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(trl_path("1.9.2")), str(stand_in.site())]))
    proc = subprocess.run([sys.executable, "-m", "shim", "doctor"], env=env, capture_output=True, text=True, cwd=str(REPO))
    assert proc.returncode == 1, proc.stdout
    assert "huggingface/trl#5312" in proc.stdout and "AFFECTED" in proc.stdout and "not always on" in proc.stdout


def test_run_reaches_every_torchrun_rank(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text((Path(__file__).parent / "children" / "rank.py").read_text())
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
    py, site = shim_venv(tmp_path / "venv")
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


def test_built_wheel_installs_one_top_level_package(tmp_path):
    """The wheel as users install it: only ``shim`` at top level, the patches inside it, and it
    works from a directory holding the user's own ``patches`` package."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(REPO)], check=True, capture_output=True, text=True, timeout=600,
                   env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))
    site = tmp_path / "site"
    (wheel,) = wheels.glob("vllm_sleep_shim-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=600)
    top = sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info") and p.name != "bin")
    assert top == ["shim"], top
    work = tmp_path / "work"
    (work / "patches").mkdir(parents=True)
    (work / "patches" / "__init__.py").write_text("MINE = True\n")
    import packaging  # the runtime deps, from this environment
    import wrapt
    deps = [os.path.dirname(os.path.dirname(m.__file__)) for m in (packaging, wrapt)]
    code = ("import json, shim.auto, shim, patches\nfrom shim.engine import catalog\n"
            "print(json.dumps({'active': shim.is_active(), 'mine': getattr(patches, 'MINE', False),"
            " 'from': catalog.patch_module('trl_gold').__file__, 'n': len(catalog.all_patches())}))")
    env = clean_env(PYTHONPATH=os.pathsep.join([str(site), *deps]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=work)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["active"] and out["mine"] and out["n"] >= 15
    assert out["from"] == str(site / "shim" / "patches" / "trl_gold.py")
