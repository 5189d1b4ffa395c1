"""``python -m shim doctor``'s activation judgement for each way in, and the allocator settings it reads.

``test_doctor.py`` covers the launcher and a plain run; here: the ``.pth`` start-up line (``python -m shim
install``: every interpreter), ``import shim.auto`` in the process (it and the processes it starts), the
launcher with SHIM_DISABLED=1 (the launcher reached it, the user turned the shim off: not "python -S?"), and
expandable segments set through ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_NPU_ALLOC_CONF`` (the guard reads every one
of ``alloc_guard.ENV_VARS``: so must doctor's verdict, not only its allocator line).
"""
import os
import re
import subprocess
import sys

from tests.support import stand_in
from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env, shim_venv
from tests.unit.test_doctor import LAUNCHER, doctor

STALE = r"^  trl-stale-weights +affected \(trl 1\.9\.2; huggingface/trl#5312\); fixed$"


def test_import_shim_auto_in_the_process_fixes_it_and_its_children():
    path = os.pathsep.join([str(REPO), str(trl_path("1.9.2")), stand_in.site()])
    code = "import shim.auto, sys\nfrom shim.cli.doctor import doctor\nsys.exit(doctor([]))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO), timeout=300,
                          env=clean_env(PYTHONPATH=path))
    assert re.search(r"^activation: import shim\.auto in this process", proc.stdout, re.M), proc.stdout
    assert re.search(STALE, proc.stdout, re.M) and proc.returncode == 0, proc.stdout + proc.stderr


def test_always_on_through_the_pth_line_fixes_every_process(tmp_path):
    py, _ = shim_venv(tmp_path / "venv", str(trl_path("1.9.2")), stand_in.site())
    env = clean_env()
    env.pop("PYTHONPATH", None)
    plain = subprocess.run([py, "-m", "shim", "doctor"], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert plain.returncode == 1 and "not always on here" in plain.stdout, plain.stdout + plain.stderr  # before
    assert subprocess.run([py, "-m", "shim", "install"], env=env, capture_output=True, text=True).returncode == 0
    proc = subprocess.run([py, "-m", "shim", "doctor"], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert re.search(r"^activation: always on \(.*vllm_sleep_shim\.pth\)", proc.stdout, re.M), proc.stdout
    assert re.search(STALE, proc.stdout, re.M) and proc.returncode == 0, proc.stdout + proc.stderr


def test_launcher_with_the_shim_disabled_says_so_not_python_s():
    path = (trl_path("1.9.2"), stand_in.site())
    code, out = doctor(*path, launcher=LAUNCHER, SHIM_DISABLED="1")
    assert code == 1 and re.search(r"^activation: through the launcher .*; SHIM_DISABLED=1: the shim is off$", out,
                                   re.M), out
    assert "python -S" not in out, out


def test_expandable_segments_through_any_allocator_variable_makes_the_guard_bite():
    path = (trl_path("1.10.0"), stand_in.site())
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF"):
        code, out = doctor(*path, **{var: "expandable_segments:True"})
        assert code == 1 and re.search(r"^  allocator-guard +AFFECTED \(vllm 0\.24\.0; ", out, re.M), (var, out)


def test_a_feature_with_one_site_disabled_is_never_plain_on():
    """Weight verification asked for with its engine half disabled (``status`` says "requested, not running"
    for TRL's half): doctor said "on where it runs", as if nothing were off. It names the disabled site; with
    every site disabled the feature is off."""
    path = (trl_path("1.16.0"), stand_in.site())
    _, on = doctor(*path, SHIM_VERIFY_WEIGHTS="1")
    assert re.search(r"^  verify-weights +on where it runs: ", on, re.M), on
    _, part = doctor(*path, SHIM_VERIFY_WEIGHTS="1", SHIM_DISABLED_PATCHES="verify-weights-vllm")
    assert re.search(r"^  verify-weights +on where it runs; verify-weights-vllm disabled", part, re.M), part
    _, off = doctor(*path, SHIM_VERIFY_WEIGHTS="1", SHIM_DISABLED_PATCHES="verify-weights")
    assert re.search(r"^  verify-weights +off \(disabled\)", off, re.M), off
