"""Patch engine: lazy hooks, decisions, idempotence, rollback (each case in a fresh interpreter)."""
import pytest

from tests.helpers import DATA, TOY_SITE, clean_env, last_json, run_python

PATH = [TOY_SITE, DATA]

RESULT = """
import json
from shim import patching
import toyup.core as core
e = core.Engine()
print(json.dumps({"out": e.generate("x"), "decisions": {k: d.text() for k, d in patching.decisions().items()},
                  "wrapped": type(vars(core.Engine)["generate"]).__name__}))
"""


def run(code, **env):
    proc = run_python(code + RESULT, path=PATH, env=clean_env(**env))
    return last_json(proc), proc.stderr


def test_activate_before_import():
    out, err = run("import toy_patches; from shim import patching, log; log.setup(); patching.activate([toy_patches.OK])")
    assert out["out"] == "patched:original:x"
    assert out["decisions"] == {"toy-ok": "applied"}
    assert err.count("toy-ok") == 1  # exactly one decision line


def test_activate_after_import():
    out, _ = run("import toyup.core, toy_patches; from shim import patching; patching.activate([toy_patches.OK])")
    assert out["out"] == "patched:original:x"


def test_activate_twice_wraps_once():
    out, err = run("import toy_patches; from shim import patching, log; log.setup()\n"
                   "patching.activate([toy_patches.OK]); patching.activate([toy_patches.OK])\n"
                   "import toyup.core; patching._on_import(toy_patches.OK, toyup.core)")
    assert out["out"] == "patched:original:x"  # not patched:patched:
    assert err.count("toy-ok") == 1


def test_disabled_by_env():
    out, _ = run("import toy_patches; from shim import patching; patching.activate([toy_patches.OK])", SHIM_DISABLED="1")
    assert out["out"] == "original:x" and out["decisions"] == {} and out["wrapped"] == "function"


def test_disabled_patch_by_env():
    out, _ = run("import toy_patches; from shim import patching; patching.activate([toy_patches.OK])",
                 SHIM_DISABLED_PATCHES="toy-ok")
    assert out["out"] == "original:x" and out["decisions"]["toy-ok"].startswith("disabled")


def test_out_of_range_stands_down_nothing_wrapped():
    out, _ = run("import toy_patches; from shim import patching; patching.activate([toy_patches.OUT_OF_RANGE])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-old"] == "stand down: version not in >=2.0"


def test_probe_failure_stands_down():
    out, _ = run("import toy_patches; from shim import patching; patching.activate([toy_patches.PROBE_FAILS])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-probe"].startswith("stand down: upstream shape changed")


def test_exception_in_patch_rolls_back_and_keeps_import():
    out, err = run("import toy_patches; from shim import patching, log; log.setup(); patching.activate([toy_patches.BOOM])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-boom"] == "failed: RuntimeError: boom inside the patch"
    assert "WARNING" in err and "boom" in err


def test_strict_mode_raises():
    proc = run_python("import toy_patches; from shim import patching; patching.activate([toy_patches.BOOM])\nimport toyup.core",
                      path=PATH, env=clean_env(SHIM_STRICT="1"), check=False)
    assert proc.returncode != 0 and "boom inside the patch" in proc.stderr


def test_remove_restores_original():
    out, _ = run("import toy_patches, toyup.core; from shim import patching; patching.activate([toy_patches.OK]); patching.remove('toy-ok')")
    assert out["out"] == "original:x" and out["wrapped"] == "function"


@pytest.mark.parametrize("var,value", [("SHIM_STRICT", "maybe"), ("SHIM_DISABLED_PATCHES", "no-such-patch")])
def test_bad_switch_one_line_and_inactive(var, value):
    proc = run_python("import shim.auto, shim; print(shim.is_active())", env=clean_env(**{var: value}))
    assert proc.stdout.strip() == "False"
    lines = [l for l in proc.stderr.splitlines() if "shim" in l]
    assert len(lines) == 1 and var in lines[0] and "accepted" in lines[0]
