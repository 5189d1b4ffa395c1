"""Weight verification on a real GPU (bench/gpu_verify_weights.py): TRL 1.9.2 GRPO + shim, 1.06 B model.

The goal: the exact check (digests of every tensor, on the device) under 1% of a GRPO step (the
shim's own measured time per check, times checks per step, over the median step); until it is
met SHIM_VERIFY_WEIGHTS=1 means ``sample`` (shim.engine.config.VERIFY_DEFAULT);
its floor (bytes read once at the measured bandwidth) is recorded; with the #5312 fix
switched off every rollout whose engine differs from the trainer (bit-for-bit ground truth)
is reported as stale weights, with it on (default and sample) none is.
"""
import pytest

from tests.gpu import common
from tests.gpu.results import load, run_of

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")

DEFAULT, SAMPLE, STALE = "verify default (exact)", "verify sample", "verify default, trl-stale-weights off"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_verify_weights", tmp_path_factory)


@pytest.mark.xfail(strict=True, reason="goal not met on the H200 (2026-12-01): exact 134 ms per check, 10.9% of a "
                   "step, 88x the floor; SHIM_VERIFY_WEIGHTS=1 stays sample until this passes")
def test_default_exact_check_under_one_percent_of_a_step(data):
    run_of(data, DEFAULT)
    fraction = data["figures"]["verify_default_fraction_of_step"]
    assert fraction is not None and fraction < 0.01, data["figures"]


def test_sample_cost_and_exact_floor_recorded(data):
    run_of(data, SAMPLE)
    figs = data["figures"]
    assert figs["verify_sample_ms_per_check"] > 0 and figs["verify_sample_fraction_of_step"] is not None, figs
    assert figs["exact_floor_ms"] > 0 and figs["exact_over_floor"] >= 1.0, figs  # no check beats reading both once


@pytest.mark.parametrize("label", [DEFAULT, SAMPLE])
def test_silent_with_the_fix(data, label):
    run = run_of(data, label)
    assert run["decisions"]["trl-stale-weights"] == "applied"
    v = data["verdicts"][label]
    assert v["stale"] == 0 and v["stale_warnings"] == 0, v
    assert v["verified"] == v["rollouts"] >= data["steps"], v


def test_missing_push_reported_with_the_fix_off(data):
    run = run_of(data, STALE)
    assert run["decisions"]["trl-stale-weights"].startswith("disabled")
    v = data["verdicts"][STALE]
    assert v["observed_stale"] and v["observed_stale"] > 0, v  # #5312 shows on the GPU (ground truth)
    assert v["stale"] == v["observed_stale"], v  # every stale rollout found, no false alarm
    assert v["verified"] == v["rollouts"] - v["observed_stale"], v
    assert v["stale_warnings"] >= 1 and "stale weights" in v["first_warning"][0], v
