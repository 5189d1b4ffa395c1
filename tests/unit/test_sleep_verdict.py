"""The sleep verdict (shim.vllm.sleep_verdict) on the vLLM stand-in: its threshold, and the cheap path.

- Threshold: a pool that tracks real memory and gives back 40% of it at a sleep is judged
  ineffective (WARNING); 60% is not. The stand-in's device keeps the pages of a "held" pool
  allocation at a sleep (``unmap_and_release`` skipped for it: physical pages still held by a
  second mapping), so the pool tracks them, releases its handle, and the device does not get
  them back -- exactly the case the verdict exists for.
- Cheap path (issue 12 part 6): the device is read on the first sleep at each level, when the
  pool changed since the last reading, and every ``SHIM_DEVICE_CHECK_EVERY``-th sleep; the
  others are verified from the pool's bookkeeping and read nothing from the device. A sleep that
  the pool says freed but the device did not is still caught, at the latest on the N-th sleep
  after the fault appeared, with exact device figures.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.vllm_scenario import scenario

GiB = 1 << 30


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


CHILDREN = Path(__file__).parent / "children"  # vllm_scenario bodies
HELD = CHILDREN / "held.py"  # the first part of the two below

THRESHOLD_BODY = (HELD, CHILDREN / "threshold.py")


@pytest.mark.parametrize("share", [0.4, 0.6])
def test_ineffective_threshold_is_half_of_what_the_pool_tracks(model_dir, share):
    off, poff = scenario(model_dir, THRESHOLD_BODY, shim=False, FREED_SHARE=share)
    on, pon = scenario(model_dir, THRESHOLD_BODY, shim=True, FREED_SHARE=share)
    for r in (off, on):  # the stand-in gives back the share asked, of a pool that tracks real memory
        assert r["tracked"] > 10 * GiB and abs(r["freed"] / r["tracked"] - share) < 0.01, r
        assert r["tokens"] == 3
    assert "ineffective" not in poff.stderr.lower()  # without the shim nobody says anything
    warnings = [line for line in pon.stderr.splitlines() if "WARNING" in line]
    if share < 0.5:
        assert len(warnings) == 1 and "ineffective sleep LLMEngine#1 level=1" in warnings[0], pon.stderr[-2000:]
        assert "less than half of what the pool tracked" in warnings[0]
        assert f"the device got back {on['freed'] / GiB:.2f} GiB" in warnings[0]  # device figures, exact
    else:
        assert warnings == [], warnings
        assert f"freed {on['freed'] / GiB:.2f} GiB of {on['tracked'] / GiB:.2f} GiB tracked (60%)" in pon.stderr


CHEAP_BODY = (HELD, CHILDREN / "cheap_path.py")


def _sleeps(trace):
    return [r for r in map(json.loads, trace.read_text().splitlines()) if r["event"] == "sleep"]


def test_cheap_path_reads_the_device_only_where_the_rule_says(model_dir, tmp_path):
    trace = tmp_path / "t.jsonl"
    on, proc = scenario(model_dir, CHEAP_BODY, shim=True, CYCLES=13, GROW_AT=5, LEVEL_AT_13=2,
                        SHIM_TRACE=str(trace))
    sleeps = _sleeps(trace)
    measured = [r["measured"] for r in sleeps]
    # 1: first sleep at level 1; 5: the pool grew since the last reading; 13: first sleep at level 2.
    # The next "every 10th" reading would be at sleep 15.
    assert measured == ["device"] + ["pool"] * 3 + ["device"] + ["pool"] * 7 + ["device"], measured
    reads = [c["reads"] for c in on["cycles"]]
    assert all(n == 0 for n, m in zip(reads, measured) if m == "pool"), reads  # no device reading at all
    assert all(n == 4 for n, m in zip(reads, measured) if m == "device"), reads  # 2 per sleep, 2 per wake
    for r, c in zip(sleeps, on["cycles"]):
        assert r["effective"] is True and r["freed"] >= 0.99 * c["freed"] > 10 * GiB, (r, c)
        assert (r["free"] is None) == (r["measured"] == "pool")
    assert "by the pool's bookkeeping" in proc.stderr and "WARNING" not in proc.stderr


@pytest.mark.parametrize("every", [None, 4])
def test_cheap_path_still_catches_a_sleep_the_device_did_not_follow(model_dir, tmp_path, every):
    """From sleep 3 on, the pool releases its handles but the device keeps the pages: the pool's
    bookkeeping cannot see it; the every-N-th device reading must (default N = 10)."""
    trace = tmp_path / "t.jsonl"
    env = dict(CYCLES=14, FAULT_AT=3, SHIM_TRACE=str(trace))
    if every:
        env["SHIM_DEVICE_CHECK_EVERY"] = str(every)
    n = every or 10
    on, proc = scenario(model_dir, CHEAP_BODY, shim=True, **env)
    sleeps = _sleeps(trace)
    assert [c["freed"] for c in on["cycles"][2:]] == [0] * 12  # the device really got nothing back
    caught = next(i for i, r in enumerate(sleeps, 1) if r["effective"] is False)
    assert caught == 1 + n, [(r["measured"], r["effective"]) for r in sleeps]  # the N-th sleep after the last reading
    assert caught - 3 < n  # within N sleeps of the fault
    bad = sleeps[caught - 1]
    assert bad["measured"] == "device" and bad["freed"] == 0 and bad["tracked"] > 10 * GiB  # exact figures
    # from there on every sleep is read on the device until one is effective again
    assert all(r["measured"] == "device" and r["effective"] is False for r in sleeps[caught:]), sleeps[caught:]
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert warnings and "ineffective sleep LLMEngine#1 level=1: the device got back 0.00 GiB" in warnings[0]


def test_device_check_every_bad_value_is_one_warning_and_the_default(monkeypatch):
    """Read inside a wrapper, where nothing may raise: a bad value is one WARNING naming the
    variable and the accepted values, then the default."""
    from shim.engine import config, log
    from shim.vllm import sleep_verdict

    log.forget("switch")
    warnings = []
    monkeypatch.setattr(log, "warning", warnings.append)
    for raw, want in (("", 10), ("3", 3), ("1", 1)):
        monkeypatch.setenv(config.SHIM_DEVICE_CHECK_EVERY, raw)
        assert sleep_verdict.check_every() == want
    for raw in ("0", "ten", "-2"):
        monkeypatch.setenv(config.SHIM_DEVICE_CHECK_EVERY, raw)
        assert sleep_verdict.check_every() == config.DEVICE_CHECK_EVERY_DEFAULT
    assert len(warnings) == 1
    assert warnings[0] == "SHIM_DEVICE_CHECK_EVERY='0' is not valid; accepted: a whole number >= 1 (or unset); using 10"


@pytest.mark.parametrize("share, effective", [(0.49, False), (0.51, True)])
def test_verdict_threshold_pinned_at_half(share, effective):
    """The threshold is half of what the pool tracks, to the percent: 49% is ineffective, 51% is not."""
    from shim.vllm import sleep_state, sleep_verdict

    state = sleep_state.SleepState(measure=sleep_state.Measurement(sleep_mode=True, engine_bytes=40 * GiB))
    tracked = 40 * GiB
    verdict, cause, _ = sleep_verdict.judge(state, tracked, int(tracked * share))
    assert verdict is effective
    assert ("less than half of what the pool tracked" in cause) is (not effective)
