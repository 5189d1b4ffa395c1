"""SHIM_DISABLED_PATCHES beyond ``test_versions_config.py``: ``*`` next to other ids still turns every patch off,
and the launcher's "warned already" marker silences only the value it warned about (a child that sets its own
list still hears about its own unknown id)."""
import json
import subprocess
import sys

from shim.engine import catalog, config
from tests.support.helpers import REPO, clean_env, run_python


def test_star_with_other_ids_turns_every_patch_off(monkeypatch):
    known = catalog.ids()
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "trl-stale-weights, *")
    assert config.disabled_patches(known, catalog.removed(), catalog.bugs()) == (frozenset(known), [])


def test_a_child_with_its_own_unknown_id_still_warns_under_the_launcher():
    child = ("import os, subprocess, sys\n"
             "env = dict(os.environ, SHIM_DISABLED_PATCHES='vllm-sleep-gard')\n"
             "subprocess.run([sys.executable, '-c', 'pass'], env=env)")
    env = clean_env(SHIM_DISABLED_PATCHES="trl-stale-weight", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "shim", sys.executable, "-c", child], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if config.SHIM_DISABLED_PATCHES in line]
    assert len(lines) == 2, proc.stderr  # the launcher's (COMMAND silent), then the child's own
    assert "'trl-stale-weight'" in lines[0] and "'vllm-sleep-gard'" in lines[1] and "vllm-sleep-guard" in lines[1], lines


def test_many_unknown_ids_are_one_short_line():
    """Five mistyped ids: the WARNING names three and counts the rest (a list of every typo is as unreadable as
    the list of every id it replaced)."""
    ids = [*catalog.bugs(), *catalog.ids()]
    line = config.unknown_patches_warning(["trl-stale-weight", "vllm-sleep-gard", "nope1", "nope2", "nope3"], ids)
    assert "and 2 more" in line and "'nope2'" not in line and len(line) < 250, line
    assert "trl-stale-weights" in line and "vllm-sleep-guard" in line, line


def test_a_site_disabled_through_its_bug_says_so():
    """``status`` / ``shim.decisions()`` of a site turned off by its bug's id name the bug (the user listed
    ``allocator-guard``, not ``vllm-worker-sleep-guard``: a reason naming only the list would not say which id)."""
    code = ("import json, shim\nshim.activate()\n"
            "print(json.dumps({r['id']: r['reason'] for r in shim.decisions() if r['decision'] == 'disabled'}))")
    by_bug = json.loads(run_python(code, env=clean_env(SHIM_DISABLED_PATCHES="allocator-guard")).stdout)
    assert by_bug["vllm-worker-sleep-guard"] == "its bug allocator-guard listed in SHIM_DISABLED_PATCHES", by_bug
    by_site = json.loads(run_python(code, env=clean_env(SHIM_DISABLED_PATCHES="vllm-worker-sleep-guard")).stdout)
    assert by_site == {"vllm-worker-sleep-guard": "listed in SHIM_DISABLED_PATCHES"}, by_site
