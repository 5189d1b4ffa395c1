"""``python -m shim doctor`` as a new user reads it: one screen, one row per upstream bug of what is installed."""
import os
import re
import subprocess
import sys

from shim.engine import catalog
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
    bugs = [r.split()[0] for r in rows if not r.strip()[0].isdigit() and not r.strip().startswith("*")]
    assert len(bugs) == len(set(bugs)), rows  # one row per upstream bug, not per site
    assert set(bugs) <= set(catalog.bugs()), rows
    assert all(not b.startswith("swift-") for b in bugs), rows  # ms-swift is not installed: no rows
    assert re.search(r"^  \d+ known bugs of packages not installed here \(.*ms-swift.*\)$", out, re.M), out
    assert "verify-weights" not in out.split("features and checks:")[0]  # a feature is not a bug
    assert re.search(r"^  verify-weights +off \(SHIM_VERIFY_WEIGHTS=1: on\)", out, re.M), out
    assert len(out.splitlines()) <= 25, out  # one screen
    assert all(len(line) <= 100 for line in out.splitlines() if not line.startswith("activation:")), out
    # 1.16.0 has open bugs the shim fixes (OnlineDPO, trl#7198, LoRA), but vLLM is not installed here: none can
    # bite this environment, each says what it needs
    assert re.search(r"^  trl-online-dpo-resync +if you use OnlineDPOTrainer with vllm \(not installed\): fixed\*$",
                     out, re.M), out
    assert code == 0, out
    _, on = doctor(trl_path("1.16.0"), SHIM_VERIFY_WEIGHTS="1")
    assert re.search(r"^  verify-weights +on where it runs", on, re.M), on


def test_a_bug_of_a_feature_you_may_not_use_never_fails_doctor():
    """Issue 29 item 2: TRL 1.10.0 (trl#5312 fixed) with vLLM, no launcher: the bugs left need a feature (OnlineDPO,
    images, LoRA, MLA models, a kv_cache-first wake, ...), each listed as "if you use X", and doctor exits 0
    (it exited 1 with four AFFECTED rows). A bug of every run (TRL 1.9.2's stale weights) still exits 1, and so
    does the allocator guard's bug once this environment turns expandable segments on."""
    path = (trl_path("1.10.0"), stand_in.site())
    code, out = doctor(*path)
    assert code == 0 and out.rstrip().endswith("doctor: nothing known-bad left unhandled"), out
    for bug, feature in (("trl-online-dpo-resync", "OnlineDPOTrainer"), ("trl-encoder-cache", "image inputs"),
                         ("trl-lora-drift", "PEFT LoRA"), ("mla-push-reprocess", "an MLA model")):
        assert re.search(rf"^  {bug} +if you use {re.escape(feature)}.*: fixed\*$", out, re.M), (bug, out)
    assert "* where the shim runs: start training with `vllm-sleep-shim CMD`" in out, out
    assert "AFFECTED" not in out, out
    # a feature's fix turned off: said, still no failure (the run may not use it)
    code, off = doctor(*path, SHIM_DISABLED_PATCHES="trl-lora-drift")
    assert code == 0 and re.search(r"^  trl-lora-drift +if you use PEFT LoRA: NOT fixed \(trl-lora-merge-drift-sync "
                                   r"disabled\)$", off, re.M), off
    # the feature doctor can see here: expandable segments in the allocator setting
    code, exp = doctor(*path, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    assert code == 1 and re.search(r"^  allocator-guard +AFFECTED \(vllm 0\.24\.0; modelscope/ms-swift#6636\); fixed only",
                                   exp, re.M), exp
    code, old = doctor(trl_path("1.9.2"), stand_in.site())
    assert code == 1 and re.search(r"^  trl-stale-weights +AFFECTED \(trl 1\.9\.2; huggingface/trl#5312\)", old, re.M), old


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
    assert re.search(r"^  trl-stale-weights +affected \(trl 1\.9\.2; huggingface/trl#5312\); fixed$", out, re.M), out
    assert re.search(r"^  level2-buffers +if you use kv_cache-first wakes \(TRL GOLD\): fixed$", out, re.M), out
    assert code == 0 and out.rstrip().endswith("doctor: nothing known-bad left unhandled"), out
    code, plain = doctor(*path)
    assert code == 1 and "not fixed in every process: trl-stale-weights" in plain, plain
    # under the launcher but the shim off in this process: not fixed, as before
    code, off = doctor(*path, launcher=LAUNCHER, SHIM_DISABLED="1")
    assert code == 1 and "SHIM_DISABLED=1: the shim is off" in off, off
    # python -S: the bootstrap never ran in that process (nor can doctor read version ranges there: no
    # site-packages, no packaging; its exit status says nothing, its activation line does)
    _, no_site = doctor(*path, launcher=LAUNCHER, args=("-S",))
    assert "_bootstrap is on PYTHONPATH but the shim is not active in this process" in no_site, no_site
