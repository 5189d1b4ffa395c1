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
    on_disk = {f[:-3] for f in os.listdir(REPO / "patches") if f.endswith(".py") and f != "__init__.py"}
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
