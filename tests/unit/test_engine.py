"""Patch engine: lazy hooks, decisions, idempotence, rollback (each case in a fresh interpreter)."""
from pathlib import Path

import pytest

from tests.support.helpers import DATA, TOY_SITE, clean_env, last_json, run_python

PATH = [TOY_SITE, DATA]

CHILDREN = Path(__file__).parent / "children"
RESULT = "\n" + (CHILDREN / "engine_result.py").read_text()  # the end of every case (after its last line)


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


def test_bad_flag_value_one_warning_and_the_patches_stay_on():
    """A typo in one switch turns off only what it controls (here strict mode): one WARNING, the fix applies."""
    out, err = run("import toy_patches; from shim.engine import registry\nregistry.activate([toy_patches.OK])",
                   SHIM_STRICT="maybe")
    assert out["decisions"] == {"toy-ok": "applied"}
    lines = [l for l in err.splitlines() if "WARNING" in l]
    assert len(lines) == 1 and "SHIM_STRICT='maybe'" in lines[0] and "accepted" in lines[0], err


def test_unknown_disabled_id_warns_once_and_the_rest_keeps_working():
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup()\n"
                   "registry.activate([toy_patches.OK, toy_patches.SECOND])",
                   SHIM_DISABLED_PATCHES="no-such-patch,toy-second")
    assert out["out"] == "patched:original:x"  # toy-ok applied, toy-second disabled
    assert out["decisions"] == {"toy-ok": "applied", "toy-second": "disabled: listed in SHIM_DISABLED_PATCHES"}
    warnings = [l for l in err.splitlines() if "WARNING" in l]
    assert len(warnings) == 1 and "'no-such-patch'" in warnings[0] and "no known id resembles it" in warnings[0]
    out, err = run("import toy_patches; from shim.engine import registry; from shim.engine import log; log.setup()\n"
                   "registry.activate([toy_patches.OK, toy_patches.SECOND])", SHIM_DISABLED_PATCHES="toy-secnd")
    warnings = [l for l in err.splitlines() if "WARNING" in l]
    assert len(warnings) == 1 and "did you mean toy-second?" in warnings[0], err


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
    code = (CHILDREN / "strict_failure.py").read_text()
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
    code = (CHILDREN / "remove_from_stack.py").read_text()
    out = last_json(run_python(code, path=PATH, argv=[first, other]))
    assert out["before"] == "second:patched:original:x" and out["removed"] is True
    assert out["mid"]["markers"] == [other]
    assert out["mid"]["out"] == {"toy-ok": "patched:original:x", "toy-second": "second:original:x"}[other]
    assert out["after"] == "original:x" and out["plain"] == "function"
    assert out["decisions"] == {"toy-ok": "stand down: removed", "toy-second": "stand down: removed"}


def test_remove_under_a_foreign_wrapper_keeps_the_foreign_one():
    code = (CHILDREN / "foreign_wrapper.py").read_text()
    out = last_json(run_python(code, path=PATH))
    assert out == {"removed": True, "out": "user:original:x", "markers": []}


def test_hooked_loader_delegates_everything_runpy_and_resources_need():
    code = (CHILDREN / "hooked_loader.py").read_text()
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


def test_a_wrapped_method_pickles_by_name_as_ray_ships_an_actor_class():
    """A Ray actor class ships by value with the methods read off the class at ``ray.remote`` (issue 30 item 1):
    the shim's wrapper pickles as ``getattr(owner, name)`` (bound: ``getattr(instance, name)``), so the loading
    process runs its own attribute -- the shim's wrappers where it is active, upstream's method where it is not
    -- never a bare copy of upstream's code; a class lookup is one object while it wraps the same thing, and a
    layer taken out below is gone from it too."""
    from tests.support.envs import verl_deps_path

    code = (CHILDREN / "pickle_by_name.py").read_text()
    out = last_json(run_python(code, path=[*PATH, verl_deps_path()]))  # cloudpickle: the verl deps' (Ray's pin)
    assert out["same"] is True and out["class"] == "second:patched:original:x", out
    assert out["here"] == "second:patched:original:x", out  # shipped with the shim active here: its wrappers
    assert out["bound"] == ["second:patched:original:x", "Engine"], out
    assert out["class_after"] == "second:original:x", out
    assert out["there"] == "original:x" and out["plain"] == "original:x", out
