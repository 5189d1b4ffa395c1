"""A bad value of one switch turns off only what that switch controls (issue 29, items 1 and 3).

- ``import shim.auto`` with a typo in one switch: one WARNING naming the variable, the value and the
  accepted values; the shim is active and every patch decides as with the switch unset (the fixes stay
  on); ``SHIM_STRICT=1`` raises ``ConfigError`` at activation instead.
- The launcher checks every switch of ``config.ALL`` before COMMAND and exits 2 with one line.
- ``python -m shim doctor`` names a bad switch and exits non-zero.
- A dependency that is not importable (TRL without vLLM) is a plain INFO stand-down, never the
  "upstream shape changed" WARNING.
"""
import json
import os
import subprocess
import sys

import pytest

from shim.engine import config
from tests.support.envs import trl_path
from tests.support.helpers import REPO, clean_env, last_json, run_python

ACCEPTED_VERIFY = "accepted: 1, 0, exact, sample, true, false, yes, no, on, off (or unset)"

# One bad value per switch. SHIM_DISABLED_PATCHES has none: an id the shim does not know is one WARNING
# and every other patch stays on (DESIGN.md: patches are deleted on schedule; test_activation.py
# test_run_unknown_disabled_id_warns_and_runs).
BAD = {
    config.SHIM_DISABLED: "maybe",
    config.SHIM_STRICT: "maybe",
    config.SHIM_DEBUG: "maybe",
    config.SHIM_TRACE: "{tmp}/no-such-dir/trace.jsonl",
    config.SHIM_VERIFY_WEIGHTS: "maybe",
    config.SHIM_DEVICE_CHECK_EVERY: "abc",
    config.SHIM_STALE_ALARM: "high",
    config.SHIM_SUMMARY_EVERY: "often",
    config.SHIM_SLEEP_LEVEL: "3",
}
NO_BAD_VALUE = {config.SHIM_DISABLED_PATCHES}

DECISIONS = """
import json, shim.auto, shim, trl.generation.vllm_generation
from shim.engine import registry
print(json.dumps({"active": shim.is_active(),
                  "decisions": {k: d.text() for k, d in sorted(registry.decisions().items())}}))
"""


def test_every_switch_has_a_bad_value_here():
    """A switch added to config.ALL without a case here fails, so the launcher test covers it."""
    assert set(BAD) | NO_BAD_VALUE == set(config.ALL)


@pytest.mark.parametrize("name", sorted(set(BAD) - {config.SHIM_TRACE}))
def test_read_of_a_bad_value_is_its_default_and_one_warning(monkeypatch, name):
    """Every accessor reads through ``config.read``: a bad value is the switch's default, ONE WARNING
    per process naming the variable, the value and the accepted values; no accessor raises."""
    from shim.engine import log

    log.forget("switch")
    warnings = []
    monkeypatch.setattr(log, "warning", warnings.append)
    monkeypatch.delenv(name, raising=False)
    default = config.read(name)
    monkeypatch.setenv(name, BAD[name])
    assert config.read(name) == default
    assert config.read(name) == default
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"{name}={BAD[name]!r} is not valid; accepted: "), warnings


def test_bad_verify_weights_keeps_every_fix_on():
    """The bug: ``SHIM_VERIFY_WEIGHTS=maybe`` logged ``[shim] ERROR ... shim not activated`` and
    nothing was patched. Now every patch decides exactly as with the switch unset, except the
    verification feature, which stands down saying why; one WARNING names the variable."""
    path = [trl_path("1.9.2")]
    good = last_json(run_python(DECISIONS, path=path, env=clean_env()))
    proc = run_python(DECISIONS, path=path, env=clean_env(SHIM_VERIFY_WEIGHTS="maybe"))
    bad = last_json(proc)
    assert bad["active"] is True, proc.stderr
    assert good["decisions"]["trl-stale-weights"] == "applied"
    assert bad["decisions"]["trl-stale-weights"] == "applied", proc.stderr  # the fix the user installed
    verify = bad["decisions"].pop("verify-weights-trl")
    assert verify == "stand down: SHIM_VERIFY_WEIGHTS is off (bad value 'maybe')"
    assert good["decisions"].pop("verify-weights-trl") == "stand down: SHIM_VERIFY_WEIGHTS is off"
    assert bad["decisions"] == good["decisions"]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("[shim") and "WARNING" in line]
    assert warnings == [f"[shim] WARNING SHIM_VERIFY_WEIGHTS='maybe' is not valid; {ACCEPTED_VERIFY}; "
                        "weight verification off"], proc.stderr
    assert "ERROR" not in proc.stderr and "not activated" not in proc.stderr


def test_bad_switch_under_strict_raises_at_activation():
    """SHIM_STRICT=1: the same typo is a ConfigError out of ``import shim.auto`` (exit non-zero)."""
    code = "import shim.auto; print('imported')"
    proc = run_python(code, env=clean_env(SHIM_STRICT="1", SHIM_VERIFY_WEIGHTS="maybe"), check=False, fresh=True)
    assert proc.returncode != 0 and "imported" not in proc.stdout, proc.stdout + proc.stderr
    assert f"shim.engine.config.ConfigError: SHIM_VERIFY_WEIGHTS='maybe' is not valid; {ACCEPTED_VERIFY}" \
        in proc.stderr, proc.stderr
    ok = run_python(code, env=clean_env(SHIM_STRICT="1"), fresh=True)  # the switch alone raises nothing
    assert ok.stdout.strip() == "imported", ok.stderr


def test_bad_switch_in_status_shows_the_rows_and_warns():
    """``python -m shim status`` with a typo: the rows as the shim decides (not an exit 2 with nothing),
    the WARNING on stderr."""
    proc = subprocess.run([sys.executable, "-m", "shim", "status", "--json"], capture_output=True, text=True,
                          cwd=str(REPO), timeout=300,
                          env=clean_env(PYTHONPATH=str(REPO), SHIM_DEVICE_CHECK_EVERY="abc"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows and not any(r["decision"] == "disabled" or "not activated" in (r["reason"] or "") for r in rows), rows
    assert proc.stderr.count("WARNING SHIM_DEVICE_CHECK_EVERY='abc' is not valid") == 1, proc.stderr


@pytest.mark.parametrize("name", sorted(BAD))
def test_launcher_checks_every_switch_before_the_command(tmp_path, name):
    """``python -m shim CMD`` with one bad switch: exit 2, one line naming the variable, CMD never
    started (before: SHIM_DEVICE_CHECK_EVERY passed and was noticed only at the first sleep)."""
    marker = tmp_path / "started"
    value = BAD[name].format(tmp=tmp_path)
    env = clean_env(PYTHONPATH=str(REPO), **{name: value})
    proc = subprocess.run([sys.executable, "-m", "shim", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=120, env=env)
    assert proc.returncode == 2 and not marker.exists(), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"shim: {name}="), lines
    assert value in lines[0]


def doctor(**env):
    return subprocess.run([sys.executable, "-m", "shim", "doctor"], capture_output=True, text=True, cwd=str(REPO),
                          timeout=300, env=clean_env(PYTHONPATH=str(REPO), **env))


def test_doctor_reports_a_bad_switch_and_exits_non_zero():
    """Before: ``SHIM_VERIFY_WEIGHTS=maybe python -m shim doctor`` said all fine and exited 0."""
    assert doctor().returncode == 0  # nothing installed here: nothing known-bad
    proc = doctor(SHIM_VERIFY_WEIGHTS="maybe")
    assert proc.returncode == 1, proc.stdout
    assert f"BAD SWITCH: SHIM_VERIFY_WEIGHTS='maybe' is not valid; {ACCEPTED_VERIFY}; weight verification off" \
        in proc.stdout.splitlines(), proc.stdout
    assert "nothing known-bad left unhandled" not in proc.stdout


def test_trl_without_vllm_is_no_shape_change():
    """TRL installed, vLLM not importable: ``trl-sleep-level`` stands down at INFO saying vLLM is not
    importable. Before: ``WARNING ... upstream shape changed: VLLMGeneration or vllm.LLM not in ...``."""
    code = ("import importlib.util\nassert importlib.util.find_spec('vllm') is None, 'vllm on the path'\n"
            + DECISIONS)
    proc = run_python(code, path=[trl_path("1.9.2")], env=clean_env(SHIM_SLEEP_LEVEL="1"))
    out = last_json(proc)
    assert out["decisions"]["trl-sleep-level"] == "stand down: vllm not importable (not installed)"
    assert "shape changed" not in proc.stderr and "[shim] WARNING" not in proc.stderr, proc.stderr
    assert ("[shim] INFO trl-sleep-level (SHIM_SLEEP_LEVEL, trl 1.9.2): stand down: vllm not importable "
            "(not installed)") in proc.stderr.splitlines()


def test_unimportable_reads_finders_only(monkeypatch):
    from shim.engine import probes

    assert probes.unimportable("json", "os") is None
    assert probes.unimportable("json", "no_such_module_xyz") == "no_such_module_xyz not importable (not installed)"
    monkeypatch.setitem(sys.modules, "no_such_module_xyz", None)
    assert "blocked" in probes.unimportable("no_such_module_xyz")
    assert probes.missing(os, ("no_such_name",), "os", needs=("json",)).startswith("upstream shape changed: ")
    assert probes.missing(os, ("no_such_name",), "os", needs=("no_such_module_xyz",)).startswith(
        "no_such_module_xyz not importable")
