"""Patch engine: lazy hooks, decisions, idempotence, rollback (each case in a fresh interpreter)."""
import pytest

from tests.support.helpers import DATA, TOY_SITE, clean_env, last_json, run_python

PATH = [TOY_SITE, DATA]

RESULT = """
import json
from shim.engine import registry
from shim.engine.patch import PatchFailed
from shim.engine.patcher import markers
import toyup.core as core
e = core.Engine()
print(json.dumps({"out": e.generate("x"), "decisions": {k: d.text() for k, d in registry.decisions().items()},
                  "wrapped": type(vars(core.Engine)["generate"]).__name__}))
"""


def run(code, **env):
    proc = run_python(code + RESULT, path=PATH, env=clean_env(**env))
    return last_json(proc), proc.stderr


def test_activate_before_import():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup(); registry.activate([toy_patches.OK])")
    assert out["out"] == "patched:original:x"
    assert out["decisions"] == {"toy-ok": "applied"}
    assert err.count("toy-ok") == 1  # exactly one decision line


def test_activate_after_import():
    out, _ = run("import toyup.core, toy_patches; from shim.engine import registry; registry.activate([toy_patches.OK])")
    assert out["out"] == "patched:original:x"


def test_activate_twice_wraps_once():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup()\n"
                   "registry.activate([toy_patches.OK]); registry.activate([toy_patches.OK])\n"
                   "import toyup.core; registry._on_import(toy_patches.OK, toyup.core)")
    assert out["out"] == "patched:original:x"  # not patched:patched:
    assert err.count("toy-ok") == 1


def test_disabled_by_env():
    out, _ = run("import toy_patches; from shim.engine import registry; registry.activate([toy_patches.OK])", SHIM_DISABLED="1")
    assert out["out"] == "original:x" and out["decisions"] == {} and out["wrapped"] == "function"


def test_disabled_patch_by_env():
    out, _ = run("import toy_patches; from shim.engine import registry; registry.activate([toy_patches.OK])",
                 SHIM_DISABLED_PATCHES="toy-ok")
    assert out["out"] == "original:x" and out["decisions"]["toy-ok"].startswith("disabled")


def test_out_of_range_stands_down_nothing_wrapped():
    out, _ = run("import toy_patches; from shim.engine import registry; registry.activate([toy_patches.OUT_OF_RANGE])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-old"] == "stand down: version not in >=2.0"


def test_probe_failure_stands_down():
    out, err = run("import toy_patches; from shim.engine import registry, log; log.setup(); "
                   "registry.activate([toy_patches.PROBE_FAILS])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-probe"].startswith("stand down: upstream shape changed: ")
    # the user relied on the fix: an unknown upstream shape is a WARNING, a range stand-down stays INFO
    assert "[shim] WARNING toy-probe" in err, err
    _, err_range = run("import toy_patches; from shim.engine import registry, log; log.setup(); "
                       "registry.activate([toy_patches.OUT_OF_RANGE])")
    assert "[shim] INFO toy-old" in err_range and "WARNING" not in err_range, err_range


def test_status_tells_applied_from_acted():
    """``acted N times``: the patch's wrappers ran in this process; ``applied`` alone: installed, never called."""
    out = last_json(run_python("import json, toy_patches, toyup.core; from shim.engine import registry; registry.activate([toy_patches.OK])\n"
                 "rows = {r['id']: registry.decision_text(r) for r in registry.status_rows([toy_patches.OK])}\n"
                 "toyup.core.Engine().generate('a'); toyup.core.Engine().generate('b')\n"
                 "rows2 = {r['id']: registry.decision_text(r) for r in registry.status_rows([toy_patches.OK])}\n"
                 "print(json.dumps({'rows': rows, 'rows2': rows2}))", path=PATH))
    assert out["rows"] == {"toy-ok": "applied"}
    assert out["rows2"] == {"toy-ok": "applied, acted 2 times"}


def test_exception_in_patch_rolls_back_and_keeps_import():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup(); registry.activate([toy_patches.BOOM])")
    assert out["out"] == "original:x" and out["wrapped"] == "function"
    assert out["decisions"]["toy-boom"] == "failed: RuntimeError: boom inside the patch"
    assert "WARNING" in err and "boom" in err


def test_strict_mode_raises():
    proc = run_python("import toy_patches; from shim.engine import registry; registry.activate([toy_patches.BOOM])\nimport toyup.core",
                      path=PATH, env=clean_env(SHIM_STRICT="1"), check=False)
    assert proc.returncode != 0 and "boom inside the patch" in proc.stderr


def test_remove_restores_original():
    out, _ = run("import toy_patches, toyup.core; from shim.engine import registry; registry.activate([toy_patches.OK]); registry.remove('toy-ok')")
    assert out["out"] == "original:x" and out["wrapped"] == "function"


def test_bad_flag_value_one_line_and_inactive():
    proc = run_python("import shim.auto, shim; print(shim.is_active())", env=clean_env(SHIM_STRICT="maybe"))
    assert proc.stdout.strip() == "False"
    lines = [l for l in proc.stderr.splitlines() if "shim" in l]
    assert len(lines) == 1 and "SHIM_STRICT" in lines[0] and "accepted" in lines[0]


def test_unknown_disabled_id_warns_once_and_the_rest_keeps_working():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup()\n"
                   "registry.activate([toy_patches.OK, toy_patches.SECOND])",
                   SHIM_DISABLED_PATCHES="no-such-patch,toy-second")
    assert out["out"] == "patched:original:x"  # toy-ok applied, toy-second disabled
    assert out["decisions"] == {"toy-ok": "applied", "toy-second": "disabled: listed in SHIM_DISABLED_PATCHES"}
    warnings = [l for l in err.splitlines() if "WARNING" in l]
    assert len(warnings) == 1 and "no-such-patch" in warnings[0] and "toy-ok, toy-second" in warnings[0]


def test_removed_id_in_disable_list_is_silent():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup()\n"
                   "registry.activate([toy_patches.OK], known_removed={'toy-gone': 'removed in 0.2'})",
                   SHIM_DISABLED_PATCHES="toy-gone")
    assert out["decisions"] == {"toy-ok": "applied"} and "WARNING" not in err


def test_real_registry_unknown_id_keeps_every_patch():
    proc = run_python("import json, shim.auto, shim\nfrom shim.engine import registry\n"
                      "print(json.dumps({'active': shim.is_active(), 'n': len(registry.decisions()),"
                      " 'waiting': sum(d.decision == 'waiting' for d in registry.decisions().values())}))",
                      env=clean_env(SHIM_DISABLED_PATCHES="trl-removed-long-ago"))
    out = last_json(proc)
    assert out["active"] and out["n"] == out["waiting"] > 10
    assert proc.stderr.count("WARNING") == 1 and "trl-removed-long-ago" in proc.stderr


def test_strict_failure_before_activation_raises_after_every_patch_is_registered():
    code = ("import json, toyup.core, toy_patches, shim\nfrom shim.engine import registry\n"
            "from shim.engine.patch import PatchFailed\n"
            "try:\n    registry.activate([toy_patches.BOOM, toy_patches.OK])\nexcept PatchFailed as exc:\n"
            "    raised = str(exc)\n"
            "print(json.dumps({'raised': raised, 'again': registry.activate([toy_patches.BOOM, toy_patches.OK]),"
            " 'decisions': {k: d.text() for k, d in registry.decisions().items()},"
            " 'out': toyup.core.Engine().generate('x')}))")
    out = last_json(run_python(code, path=PATH, env=clean_env(SHIM_STRICT="1")))
    assert out["raised"].startswith("toy-boom: RuntimeError: boom inside the patch")
    assert out["decisions"] == {"toy-boom": "failed: RuntimeError: boom inside the patch", "toy-ok": "applied"}
    assert out["out"] == "patched:original:x" and out["again"] is True


def test_probe_and_apply_run_outside_the_registry_lock():
    out, _ = run("import toy_patches; from shim.engine import registry; registry.activate([toy_patches.LOCK_PROBE])\n"
                 "import toyup.core\nassert toy_patches.LOCK_SEEN == [False], toy_patches.LOCK_SEEN")
    assert out["decisions"] == {"toy-lock": "applied"}


@pytest.mark.parametrize("first", ["toy-ok", "toy-second"])
def test_remove_from_a_stack_of_two_takes_out_only_its_own(first):
    other = {"toy-ok": "toy-second", "toy-second": "toy-ok"}[first]
    code = ("import json, toyup.core, toy_patches\nfrom shim.engine import registry\n"
            "from shim.engine.patcher import markers\n"
            "registry.activate([toy_patches.OK, toy_patches.SECOND])\n"
            "E = toyup.core.Engine\nbefore = E().generate('x')\n"
            f"removed = registry.remove({first!r})\n"
            "mid = {'out': E().generate('x'), 'markers': markers(vars(E)['generate'])}\n"
            f"registry.remove({other!r})\n"
            "print(json.dumps({'before': before, 'removed': removed, 'mid': mid, 'after': E().generate('x'),"
            " 'plain': type(vars(E)['generate']).__name__,"
            " 'decisions': {k: d.text() for k, d in registry.decisions().items()}}))")
    out = last_json(run_python(code, path=PATH))
    assert out["before"] == "second:patched:original:x" and out["removed"] is True
    assert out["mid"]["markers"] == [other]
    assert out["mid"]["out"] == {"toy-ok": "patched:original:x", "toy-second": "second:original:x"}[other]
    assert out["after"] == "original:x" and out["plain"] == "function"
    assert out["decisions"] == {"toy-ok": "stand down: removed", "toy-second": "stand down: removed"}


def test_remove_under_a_foreign_wrapper_keeps_the_foreign_one():
    code = ("import json, wrapt, toyup.core, toy_patches\nfrom shim.engine import registry\n"
            "from shim.engine.patcher import markers\n"
            "registry.activate([toy_patches.OK])\nE = toyup.core.Engine\n"
            "wrapt.wrap_function_wrapper(E, 'generate', lambda w, i, a, k: 'user:' + w(*a, **k))\n"
            "removed = registry.remove('toy-ok')\n"
            "print(json.dumps({'removed': removed, 'out': E().generate('x'), 'markers': markers(vars(E)['generate'])}))")
    out = last_json(run_python(code, path=PATH))
    assert out == {"removed": True, "out": "user:original:x", "markers": []}


def test_hooked_loader_delegates_everything_runpy_and_resources_need():
    code = ("import json, runpy, importlib.util, toy_patches\nfrom shim.engine import registry\n"
            "registry.activate([toy_patches.OK])\n"
            "spec = importlib.util.find_spec('toyup.core')\n"
            "loader = spec.loader\n"
            "ns = runpy.run_module('toyup.core')\n"
            "print(json.dumps({'loader': type(loader).__name__, 'package': loader.is_package('toyup.core'),"
            " 'source': 'class Engine' in loader.get_source('toyup.core'), 'file': loader.get_filename('toyup.core').endswith('core.py'),"
            " 'runpy': 'Engine' in ns}))")
    out = last_json(run_python(code, path=PATH))
    assert out == {"loader": "_Loader", "package": False, "source": True, "file": True, "runpy": True}


def test_shadow_puts_back_exactly_and_stacks():
    """``shadow.shadow``: an attribute of one object for one block, as the LoRA push stand-ins use it
    (``shim.peft.merge``, ``shim.trl.lora_merge``), next to others that stand in for the same name (the
    reload session's ``load_weights``)."""
    from shim.engine.shadow import shadow

    class Model:
        def load_weights(self, weights):
            return ("class", weights)

    m = Model()
    with shadow(m, "load_weights", lambda w: ("ours", w)):
        assert m.load_weights(1) == ("ours", 1)
    assert "load_weights" not in vars(m) and m.load_weights(2) == ("class", 2)  # the class's shows again

    own = lambda w: ("own", w)  # noqa: E731
    m.load_weights = own
    with shadow(m, "load_weights", lambda w: ("ours", w)):
        pass
    assert vars(m)["load_weights"] is own  # the object's own value back
    del m.load_weights

    with shadow(m, "load_weights", lambda w: ("ours", w)):  # another stand-in inside ours that,
        m.load_weights = lambda w: ("inner", w)                   # like the reload session, deletes the
        del m.load_weights                                         # attribute when it ends
    assert "load_weights" not in vars(m)  # nothing raised, nothing left

    outer = lambda w: ("outer", w)  # noqa: E731
    m.load_weights = outer  # one outside ours: ours goes, theirs stays
    with shadow(m, "load_weights", lambda w: ("ours", w)):
        assert m.load_weights(3) == ("ours", 3)
    assert vars(m)["load_weights"] is outer
    del m.load_weights

    top = lambda w: ("top", w)  # noqa: E731
    with shadow(m, "load_weights", lambda w: ("ours", w)):  # one set on top of ours and kept:
        m.load_weights = top                                  # ours does not take it away
    assert vars(m)["load_weights"] is top
