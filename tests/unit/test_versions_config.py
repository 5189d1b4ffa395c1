import pytest

from shim.engine import config, log
from shim.engine.versions import in_range, installed


@pytest.mark.parametrize("version,spec,expected", [
    ("1.9.2", ">=0.28.0,<1.10.0", True),
    ("1.10.0", ">=0.28.0,<1.10.0", False),
    ("0.28.0", ">=0.28.0,<1.10.0", True),
    ("1.10.0rc1", ">=0.28.0,<1.10.0", False),  # PEP 440: <V excludes pre-releases of V
    ("1.9.3.dev1", ">=0.28.0,<1.10.0", True),
    ("0.10.2.dev45+g1a2b", ">=0.10,<0.11", True),
    ("2.6.0+cu128", ">=2.6,<2.7", True),
    ("0.24.0rc1", "<0.24.0rc1", False),
    ("not-a-version", ">=0", False),
])
def test_in_range(version, spec, expected):
    assert in_range(version, spec) is expected


def test_installed():
    assert installed("packaging")
    assert installed("no-such-distribution-xyz") is None


@pytest.mark.parametrize("value,expected", [("", False), ("0", False), ("1", True), ("TRUE", True), ("off", False)])
def test_flags(monkeypatch, value, expected):
    monkeypatch.setenv(config.SHIM_STRICT, value)
    assert config.strict() is expected


def test_strict_never_raises_where_failures_are_handled_and_validate_reports_it(monkeypatch):
    log.forget("switch")
    monkeypatch.setenv(config.SHIM_STRICT, "2")
    assert config.strict() is False  # a bad value is off where a failure is handled ...
    with pytest.raises(config.ConfigError, match="SHIM_STRICT='2' is not valid"):
        config.validate()  # ... and one error at activation


def test_bad_flag_names_variable_and_values(monkeypatch):
    log.forget("switch")
    monkeypatch.setenv(config.SHIM_DEBUG, "2")
    with pytest.raises(config.ConfigError, match="SHIM_DEBUG='2' is not valid; accepted: 1, 0"):
        raise config.problem(config.SHIM_DEBUG)
    assert config.debug() is False  # read: the default, one WARNING (tests/unit/test_switches.py)


def test_disabled_patches(monkeypatch):
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "a, b")
    assert config.disabled_patches(["a", "b", "c"]) == ({"a", "b"}, [])
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "*")
    assert config.disabled_patches(["a", "b"]) == ({"a", "b"}, [])
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "zz, a, gone")  # unknown: reported, never an error
    assert config.disabled_patches(["a", "b"], removed={"gone": "removed in 0.2"}) == ({"a"}, ["zz"])


def test_a_bug_id_turns_off_every_site_a_site_id_only_itself(monkeypatch):
    """Issue 28 item 1: one id for one upstream bug (the allocator guard was three ids to find); a site's own id
    keeps working as before (an INFO line names its bug), so nobody's disable list changes meaning."""
    bugs = {"guard": ["guard", "guard-worker", "guard-npu"], "lone": ["lone"], "pair": ["pair-a", "pair-b"]}
    known = ["guard", "guard-worker", "guard-npu", "lone", "pair-a", "pair-b"]
    cases = {"guard": {"guard", "guard-worker", "guard-npu"}, "guard-worker": {"guard-worker"},
             "pair": {"pair-a", "pair-b"}, "lone": {"lone"}, "pair-b, guard-npu": {"pair-b", "guard-npu"}}
    for value, off in cases.items():
        monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, value)
        assert config.disabled_patches(known, (), bugs) == (off, []), value
    assert config.site_aliases(bugs) == [("pair-b", "pair"), ("guard-npu", "guard")]
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "guard-worker, guard, lone, nope")
    assert config.disabled_patches(known, (), bugs) == ({"guard", "guard-worker", "guard-npu", "lone"}, ["nope"])
    assert config.site_aliases(bugs) == []  # its bug is listed too: nothing to tell
    monkeypatch.setenv(config.SHIM_DISABLED_PATCHES, "pair")
    assert config.disabled_patches(known) == (set(), ["pair"])  # without the bug table a bug id is unknown

@pytest.mark.parametrize("value,expected", [("", None), ("1", 1), (" 2 ", 2)])
def test_sleep_level(monkeypatch, value, expected):
    monkeypatch.setenv(config.SHIM_SLEEP_LEVEL, value)
    assert config.sleep_level() == expected


@pytest.mark.parametrize("value", ["3", "0", "one", "1.0"])
def test_bad_sleep_level_is_one_warning_and_the_shim_stays_on(value):
    """A bad SHIM_SLEEP_LEVEL: one WARNING naming the variable and the accepted values; the shim is
    active (every fix hooked), the level is the trainer's own."""
    from tests.support.helpers import clean_env, run_python

    proc = run_python("import shim.auto, shim, sys; from shim.engine import config\n"
                      "print(shim.is_active(), 'trl' in sys.modules, config.sleep_level())",
                      env=clean_env(SHIM_SLEEP_LEVEL=value))
    assert proc.stdout.split() == ["True", "False", "None"]
    assert proc.stderr.strip().splitlines() == [
        f"[shim] WARNING SHIM_SLEEP_LEVEL={value!r} is not valid; accepted: 1, 2 (or unset: the trainer's own level); "
        "TRL's own sleep level is used"]
