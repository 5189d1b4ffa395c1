"""What the shim prints over a real GRPO run (bench/gpu_log_volume.py: TRL 1.9.2, 1.06 B model, 100 steps).

At INFO: the patch decisions, the engine's construction, its first sleep, first wake and first
sleep verified from the pool's bookkeeping, and a summary every SHIM_SUMMARY_EVERY (50) sleeps
plus one at exit; no WARNING on a healthy run; every other sleep/wake only in the trace.
"""
import math

import pytest

from tests.gpu import common
from tests.gpu.results import load

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")

ENGINE_LINES = {"init LLMEngine#1": 1, "sleep LLMEngine#1": 2, "wake LLMEngine#1": 1}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_log_volume", tmp_path_factory)


def test_run_finished(data):
    assert data["status"] == "ok", data["status"]
    assert data["steps"] == data["steps_asked"] >= 100


def test_info_lines_do_not_grow_with_the_steps(data):
    kinds = dict(data["info_kinds"])
    assert not (data["log_levels"] or {}).get("WARNING"), data["log_levels"]
    sleeps = data["trace_events"]["sleep"]
    assert sleeps >= data["steps"]  # one sleep per step at least: every one was an INFO line before
    assert data["summaries"] == math.floor(sleeps / 50) + 1  # periodic + at exit
    assert kinds.pop("sleep summary") == data["summaries"]
    kinds.pop("patch decision")
    assert kinds == ENGINE_LINES
