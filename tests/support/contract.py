"""The patch contract, generated for every registered patch (as ddtrace's ``PatchTestCase``).

``contract_tests("<patch module>")`` returns the test functions for one patch module; each
``tests/patches/<module>/test_contract.py`` binds them. Every case runs in its own process
(``contract_child.py`` imports torch and transformers once per release, for every patch that
release tests, then forks one process per case, before anything of the shim or the patched
upstream module is imported; the cases that import upstream first fork from a parent that
imported it) against a REAL
upstream release that the patch affects (the TRL
releases of ``tests/support/envs.py``, the ms-swift venvs of ``tests/support/swift_envs.py``, the vLLM
stand-in for vLLM's GPU engine):

- ``before``: activate before the upstream import, then activate twice: applied, wrapped once;
- ``after``: activate after the import; ``remove`` takes out only this patch's layer from a
  stack of two and leaves the exact original objects;
- ``out_of_range``: stands down, nothing changed;
- ``shape``: the names it patches deleted upstream: stands down (probe), nothing changed;
- ``apply_raises``: failed, rolled back to the identical objects, the import goes on.

Plus, in process: the module's docstring schema (``Upstream:``/``Affects:``/``Remove:``) agrees
with each record, and the registry row agrees with the record.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest

from tests.support.helpers import REPO, clean_env

CHILD = REPO / "tests" / "support" / "contract_child.py"
CASES = ("before", "after", "out_of_range", "shape", "apply_raises")

@functools.lru_cache(maxsize=None)
def targets() -> dict:
    """patch id -> ``(kind, release)``, the record's ``tested_at``: where its upstream module is importable at an
    affected release (the test environments of tests/support/envs.py and swift_envs.py; ``vllm``: the stand-in
    alone, ``vllm-npu``: its NPU mode, ``swift-megatron``: ms-swift with the mcore-bridge stand-in, ``ray``: the
    verl envs' Ray alone)."""
    from shim.engine import catalog

    return {patch.id: patch.tested_at for patch in catalog.all_patches()}


# patch module -> switches its cases run with (the verify-only records stand down while their switch is off)
MODULE_ENV = {"verify_weights": {"SHIM_VERIFY_WEIGHTS": "1"}, "trl_sleep_level": {"SHIM_SLEEP_LEVEL": "1"}}
CASE_ENV = "CONTRACT_CASE_ENV"
"""JSON ``{patch id: {var: value}}``: what ``contract_child.py`` sets in a case's fork (MODULE_ENV)."""


def _environment(kind: str, release: str):
    env = clean_env(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                    HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    from tests.support.trl_support import fake_site, vllm_for

    if kind == "trl":
        from tests.support.envs import trl_path

        python, vllm = sys.executable, vllm_for(release)
        path = [trl_path(release), fake_site(vllm)]
    elif kind.startswith("swift"):
        from tests.support.swift_envs import swift_python, swift_pythonpath
        from tests.support.swift_support import vllm_for as swift_vllm_for

        python, vllm = str(swift_python(release)), swift_vllm_for(release)
        path = [fake_site(vllm), *swift_pythonpath(release)]
    elif kind == "verl":
        from tests.support.verl_support import verl_environment

        python, vllm = sys.executable, None
        path, verl_env = verl_environment(release)
        env.update(verl_env)
    elif kind == "ray":  # Ray alone (the verl envs' shared packages): no vLLM
        from tests.support.envs import verl_deps_path

        python, vllm = sys.executable, None
        path = [verl_deps_path()]
    elif kind == "vllm-npu":  # the stand-in in NPU mode, with vllm-ascend metadata
        from tests.support.stand_in import site

        python, vllm = sys.executable, release
        path = [site(release, "npu")]
        env["FAKEVLLM_DEVICE"] = "npu"
    else:
        python, vllm = sys.executable, release
        path = [fake_site(release)]
    if vllm is not None:
        env["FAKEVLLM_VERSION"] = vllm
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [str(REPO)])
    return python, env


@functools.lru_cache(maxsize=None)
def group_results(kind: str, release: str) -> dict:
    """``{(patch id, case): result dict or traceback str}`` for every case of every patch whose
    record's ``tested_at`` is ``(kind, release)``: one interpreter pays the imports every case of that
    release shares (``contract_child.py`` forks per case), computed once per pytest run. The test
    workers of one run share it through a file under ``.envs/contract-runs/<run id>/``
    (pytest-xdist's run id, one per session), written under an exclusive lock by the first
    worker that needs it."""
    from tests.support.envs import _FileLock

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    folder = REPO / ".envs" / "contract-runs" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{release}"
    path = folder / f"{name}.json"
    with _FileLock(folder / f".{name}.lock", timeout=3600.0):
        if not path.exists():
            results = _compute(kind, release)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps([[pid, case, out] for (pid, case), out in results.items()]))
            os.replace(tmp, path)
    return {(pid, case): out for pid, case, out in json.loads(path.read_text())}


def _compute(kind: str, release: str) -> dict:
    from shim.engine import catalog

    modules = {row[0]: row[1] for row in catalog.index()}
    pids = [pid for pid in modules if targets().get(pid) == (kind, release)]
    python, env = _environment(kind, release)
    env[CASE_ENV] = json.dumps({pid: MODULE_ENV[modules[pid]] for pid in pids if modules[pid] in MODULE_ENV})
    results = {}
    with tempfile.TemporaryDirectory(prefix="contract-") as out:
        args = [f"{pid}:{case}" for pid in pids for case in CASES]
        extra = (["--megatron"] if kind == "swift-megatron" else []) + (["--swift"] if kind.startswith("swift") else []) \
            + (["--trl"] if kind == "trl" else []) + (["--bare"] if kind == "ray" else [])
        proc = subprocess.run([python, str(CHILD), out, *extra, *args], env=env, capture_output=True, text=True,
                              timeout=1800, cwd=str(REPO))
        for arg in args:
            pid, case = arg.split(":")
            ok, err = os.path.join(out, arg + ".json"), os.path.join(out, arg + ".err")
            if os.path.exists(ok):
                with open(ok) as f:
                    results[pid, case] = json.load(f)
            elif os.path.exists(err):
                with open(err) as f:
                    results[pid, case] = f.read()
            else:
                results[pid, case] = f"no result (exit {proc.returncode})\nSTDERR:\n{proc.stderr[-4000:]}"
    return results


def run_case(patch_id: str, case: str) -> dict:
    out = group_results(*targets()[patch_id])[patch_id, case]
    if isinstance(out, str):
        raise AssertionError(f"{patch_id} {case}:\n{out}")
    return out


def check_case(patch_id: str, case: str) -> None:
    out = run_case(patch_id, case)
    if case == "before":
        assert out["decision"] == "applied" and out["again"] is True, out
        assert out["changes"], f"{patch_id} applied but changed nothing"
        for change in out["changes"]:
            assert change["markers"].count(patch_id) <= 1, change  # wrapped once
    elif case == "after":
        assert out["decision"] == "applied", out
        assert out["removed"] is True and out["status"] == "stand down: removed", out
        for change in out["after_remove"]:
            assert patch_id not in change["markers"], change
        assert out["other_reaches_original"], out
        assert out["exact"], out
    elif case in ("out_of_range", "shape"):
        assert out["decision"] == "stand down", out
        assert out["changes"] == [], out
        if case == "shape":
            assert out["deleted"], out
            from shim.engine import probes

            assert probes.is_changed(out["reason"]), out  # one format, logged as a WARNING
    elif case == "apply_raises":
        assert out["decision"] == "failed" and "contract: apply fails" in out["reason"], out
        assert out["made"] > 0 and out["exact"] and out["markers_left"] == [], out


_SCHEMA = re.compile(r"^(Upstream|Affects|Remove):", re.M)


def check_schema(module_name: str) -> None:
    from shim.engine import catalog

    module = catalog.patch_module(module_name)
    doc = module.__doc__ or ""
    fields = {}
    for block in re.split(r"\n(?=(?:Upstream|Affects|Remove):)", doc):
        match = _SCHEMA.match(block)
        if match:
            fields[match.group(1)] = block.split("\n\n")[0]
    assert set(fields) == {"Upstream", "Affects", "Remove"}, f"{module_name}: docstring lacks {set(_SCHEMA.pattern) and ({'Upstream', 'Affects', 'Remove'} - set(fields))}"
    assert doc.splitlines()[0].strip(), f"{module_name}: no summary line"
    rows = [row for row in catalog.index() if row[1] == module_name]
    patches = module.PATCHES
    assert isinstance(patches, list) and patches, f"{module_name}: PATCHES must be a non-empty list"
    assert [(p.id, p.module) for p in patches] == [(r[0], r[2]) for r in rows], \
        f"{module_name}: INDEX rows {rows} do not match PATCHES {patches}"
    for patch in patches:
        assert patch.distribution.split("-")[-1] in fields["Affects"], (patch.id, fields["Affects"])
        for version in re.findall(r"\d+(?:\.\d+)+", patch.affected):
            assert version in fields["Affects"], f"{patch.id}: range {patch.affected} not in the docstring's Affects"
        if re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", patch.issue):
            assert patch.issue in fields["Upstream"], f"{patch.id}: {patch.issue} not in the docstring's Upstream"
    bugs = catalog.bug_records()
    for row in rows:  # each site's module names the upstream reference of the bug it fixes (issue 28: per bug)
        reference = bugs[row[3]].reference
        parts = (reference or "").rstrip("/").split("/")
        if len(parts) > 4 and parts[-2] in ("issues", "pull"):
            upstream = " ".join(fields["Upstream"].split())
            assert f"{parts[-4]}/{parts[-3]}" in upstream and re.search(rf"#{parts[-1]}\b", upstream), \
                f"{row[0]}: its bug {row[3]}'s reference {reference} is not in the docstring's Upstream"


def contract_tests(module_name: str):
    """``(test_contract, test_schema)`` for the patches of ``shim.patches.<module_name>``."""
    from shim.engine import catalog

    ids = [row[0] for row in catalog.index() if row[1] == module_name]
    # one worker runs every case of one release's batch (--dist loadgroup): the batch is one interpreter per
    # (kind, release), shared by the patches of several modules; a second worker would wait on its lock
    params = [pytest.param(pid, case, id=f"{pid}-{case}",
                           marks=pytest.mark.xdist_group("contract-{}-{}".format(*targets()[pid])))
              for pid in ids for case in CASES]

    @pytest.mark.parametrize("patch_id,case", params)
    def test_contract(patch_id, case):
        check_case(patch_id, case)

    def test_schema():
        check_schema(module_name)

    return test_contract, test_schema
