"""The registry as a whole: ids unique, every patch module has its contract tests and a target."""
import os

from shim.engine import catalog
from tests.support.contract import targets
from tests.support.helpers import REPO


def test_ids_unique_and_removed_ids_not_reused():
    ids = catalog.ids()
    assert len(ids) == len(set(ids))
    assert not set(ids) & set(catalog.removed())


def test_every_patch_module_has_a_contract_test_file_and_a_target():
    modules = {row[1] for row in catalog.index()}
    on_disk = {f[:-3] for f in os.listdir(REPO / "patches") if f.endswith(".py") and f not in ("__init__.py", "bugs.py")}
    assert modules == on_disk, "every patches/*.py is in INDEX and every INDEX module exists"
    for module in modules:
        assert (REPO / "tests" / "patches" / module / "test_contract.py").exists(), module
    missing = [pid for pid, where in targets().items() if not where]
    assert not missing, f"records without tested_at (where the generated contract tests them): {missing}"
    assert set(targets()) == set(catalog.ids())


def test_importing_the_patch_package_imports_no_patch_module():
    from tests.support.helpers import run_python

    proc = run_python("import sys, shim.auto\nprint(sorted(m for m in sys.modules if m.startswith('shim.patches.')))")
    assert proc.stdout.strip() == "[]"


def test_every_site_names_a_bug_of_one_kind_and_every_bug_has_sites():
    """Issue 28 item 1: the bug is the unit. Each INDEX row's bug id is a row of ``patches/bugs.py``; a bug's
    sites share one kind; a fix has a link or says it was reported nowhere; no bug id is also a site id of
    another bug (``SHIM_DISABLED_PATCHES=<id>`` must mean one thing)."""
    records = catalog.bug_records()
    sites = catalog.bugs()
    assert list(records) == list(dict.fromkeys(records)) and set(sites) == set(records), (
        set(sites) ^ set(records))
    kinds = {p.id: p.kind for p in catalog.all_patches()}
    for bug, ids in sites.items():
        assert len({kinds[i] for i in ids}) == 1, (bug, {i: kinds[i] for i in ids})
        ref = records[bug].reference
        assert ref is None or ref.startswith("https://github.com/"), (bug, ref)
        assert records[bug].problem and not records[bug].problem.endswith("."), bug
        assert set(records[bug].needs) <= {"vllm", "deepspeed", "trl", "ms-swift"}, bug
    for bug, ids in sites.items():  # a site id keeps meaning that site alone: a bug of several sites has its own id
        assert bug not in kinds or ids == [bug], f"{bug} is a bug id of {ids} and a site id"


def test_the_bug_id_disables_every_site_through_activation():
    """``SHIM_DISABLED_PATCHES=allocator-guard`` (the bug) turns off its three sites (LLMEngine, vLLM's worker,
    vllm-ascend's worker); a site id alone turns off that site, as before, and an INFO line names the bug."""
    import json

    from tests.support.helpers import clean_env, run_python

    code = ("import json, shim\nfrom shim.engine import registry\nshim.activate()\n"
            "print(json.dumps(sorted(k for k, v in registry.decisions().items() if v.decision == 'disabled')))")
    sites = catalog.bugs()["allocator-guard"]
    assert sites == ["vllm-sleep-guard", "vllm-worker-sleep-guard", "vllm-ascend-worker-sleep-guard"]
    proc = run_python(code, env=clean_env(SHIM_DISABLED_PATCHES="allocator-guard"))
    assert json.loads(proc.stdout) == sorted(sites), proc.stderr
    proc = run_python(code, env=clean_env(SHIM_DISABLED_PATCHES="vllm-worker-sleep-guard"))
    assert json.loads(proc.stdout) == ["vllm-worker-sleep-guard"], proc.stderr
    assert ("SHIM_DISABLED_PATCHES: vllm-worker-sleep-guard is one site of bug allocator-guard; allocator-guard "
            "turns off all 3") in proc.stderr, proc.stderr
    proc = run_python(code, env=clean_env(SHIM_DISABLED_PATCHES="vllm-sleep-guard"))  # a site id: that site only
    assert json.loads(proc.stdout) == ["vllm-sleep-guard"], proc.stderr
