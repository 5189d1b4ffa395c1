"""``python -m shim doctor`` as a new user reads it: one screen, one row per upstream bug of what is installed."""
import os
import re
import subprocess
import sys

from tests.support import stand_in
from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env


def doctor(*path, launcher=(), args=(), **env):
    """``python -m shim doctor`` with ``path`` after this checkout on PYTHONPATH; ``launcher``: what goes before
    it (``[sys.executable, "-m", "shim"]``: the README's ``vllm-sleep-shim python -m shim doctor``); ``args``:
    interpreter options."""
    proc = subprocess.run([*launcher, sys.executable, *args, "-m", "shim", "doctor"], capture_output=True, text=True,
                          cwd=str(REPO), timeout=300,
                          env=clean_env(PYTHONPATH=os.pathsep.join([str(REPO), *map(str, path)]), **env))
    return proc.returncode, proc.stdout


def bugs_section(out: str) -> list:
    return out.split("known bugs:\n")[1].split("features and checks:")[0].strip().splitlines()


def test_only_trl_installed_one_row_per_bug_features_apart_and_short():
    code, out = doctor(trl_path("1.16.0"))
    rows = bugs_section(out)
    issues = [re.split(r" +(?:not affected|AFFECTED|affected) \(", r.strip())[0] for r in rows if not r.strip()[0].isdigit()]
    assert len(issues) == len(set(issues)), rows  # one row per upstream bug, not per record
    assert all(not r.strip().startswith("modelscope/") for r in rows), rows  # ms-swift is not installed: no rows
    assert re.search(r"^  \d+ known bugs of packages not installed here \(.*ms-swift.*\)$", out, re.M), out
    assert "weight verification" not in out.split("features and checks:")[0]  # a feature is not a bug
    assert re.search(r"^  weight verification \(SHIM_VERIFY_WEIGHTS\) +off \(set SHIM_VERIFY_WEIGHTS=1", out, re.M), out
    assert len(out.splitlines()) <= 25, out  # one screen
    # 1.16.0 has two open bugs the shim fixes (OnlineDPO, trl#7198): not fixed in every process -> exit 1
    assert code == 1 and "trl OnlineDPO level-2 gap" in out.splitlines()[-2], out
    _, on = doctor(trl_path("1.16.0"), SHIM_VERIFY_WEIGHTS="1")
    assert re.search(r"^  weight verification \(SHIM_VERIFY_WEIGHTS\) +on ", on, re.M), on


def test_nothing_installed_exits_0_and_says_how_many_bugs_are_elsewhere():
    code, out = doctor()
    assert code == 0, out
    from shim.engine import catalog

    fixes = sorted({p.distribution for p in catalog.all_patches() if p.kind == "fix"})
    assert {"ms-swift", "trl", "verl", "vllm"} <= set(fixes)
    assert bugs_section(out)[0].strip().endswith(f"known bugs of packages not installed here ({', '.join(fixes)})")
    assert out.rstrip().endswith("doctor: nothing known-bad left unhandled")


def test_allocator_setting_read_with_the_guards_parser_last_key_wins():
    _, off = doctor(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,expandable_segments:False")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,expandable_segments:False" in off
    assert "expandable segments ON" not in off, off  # the guard reads it as off: so does doctor
    _, on = doctor(PYTORCH_NPU_ALLOC_CONF="max_split_size_mb:64,expandable_segments:True")
    assert "PYTORCH_NPU_ALLOC_CONF=max_split_size_mb:64,expandable_segments:True  <- expandable segments ON" in on


LAUNCHER = (sys.executable, "-m", "shim")


def test_under_the_launcher_every_process_is_fixed_exit_0():
    """Issue 29 item 2: doctor run the README's way (``vllm-sleep-shim python -m shim doctor``) judges that
    launch: the bootstrap reaches this process and every process it starts, so TRL 1.9.2's and vLLM's bugs
    are fixed everywhere (exit 0), where a plain ``python -m shim doctor`` still says they are not (exit 1)."""
    path = (trl_path("1.9.2"), stand_in.site())
    code, out = doctor(*path, launcher=LAUNCHER)
    assert "not fixed in every process" not in out and "start training through the shim" not in out, out
    assert re.search(r"^activation: through the launcher \(.*_bootstrap on PYTHONPATH\): this process and every", out, re.M)
    assert re.search(r"^  huggingface/trl#5312 +affected \(trl 1\.9\.2\); fixed by trl-stale-weights$", out, re.M), out
    assert re.search(r"^  vllm-project/vllm#45619 +affected \(vllm 0\.24\.0\); fixed by vllm-level2-buffers$", out, re.M), out
    assert code == 0 and out.rstrip().endswith("doctor: nothing known-bad left unhandled"), out
    code, plain = doctor(*path)
    assert code == 1 and "not fixed in every process" in plain and "huggingface/trl#5312" in plain, plain
    # under the launcher but the shim off in this process: not fixed, as before
    code, off = doctor(*path, launcher=LAUNCHER, SHIM_DISABLED="1")
    assert code == 1 and "SHIM_DISABLED=1: the shim is off" in off, off
    # python -S: the bootstrap never ran in that process (nor can doctor read version ranges there: no
    # site-packages, no packaging; its exit status says nothing, its activation line does)
    _, no_site = doctor(*path, launcher=LAUNCHER, args=("-S",))
    assert "_bootstrap is on PYTHONPATH but the shim is not active in this process" in no_site, no_site
