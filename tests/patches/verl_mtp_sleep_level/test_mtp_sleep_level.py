"""``verl-mtp-sleep-level`` on the real verl releases: verl's own HYBRID ``vLLMHttpServer.sleep`` with MTP
rollout on, the stand-in's ``AsyncLLM`` (engine core in its own process) with an MTP drafter in the weights tag
(``tests/support/verl_support.py``)."""
import pytest

from tests.support.verl_support import run_sleep


@pytest.mark.parametrize("version", ["0.8.0", "0.7.1"])
def test_mtp_rollout_sleeps_at_level_1_and_keeps_the_drafter(version, tmp_path):
    """Shim off (the bug, verl#6661): level 2 reaches the worker and the drafter's weights are garbage after
    verl's wake. Shim on: level 1, the drafter's weights the ones it slept with. MTP off: level 2 unchanged."""
    r = run_sleep(version, tmp_path)
    assert r["off"]["levels"] == [2], r
    assert not r["off"]["drafter_kept"] and r["off"]["drafter_origin"] == "garbage", r
    assert r["decision"] == "applied", r
    assert r["on"]["levels"] == [1], r
    assert r["on"]["drafter_kept"] and r["on"]["drafter_origin"] == "initialized", r
    assert r["on_mtp_off"]["levels"] == [2], r


def test_verl_0_9_0_stands_down_and_sleeps_mtp_at_level_1(tmp_path):
    """verl 0.9.0 has the fix (its ``_sleep_hybrid`` reads ``config.mtp``): the record stands down (version
    range) and upstream's own sleep is level 1 with MTP on, level 2 with it off."""
    r = run_sleep("0.9.0", tmp_path)
    assert r["decision"] == "stand down: fixed upstream in 0.9.0", r  # the range, before any probe
    assert r["off"]["levels"] == [1] and r["off"]["drafter_kept"], r
    assert r["on"]["levels"] == [1] and r["on"]["drafter_kept"], r
    assert r["on_mtp_off"]["levels"] == [2], r
