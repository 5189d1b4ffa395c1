"""vLLM sleep mode on real memory with the shim (bench/gpu_sleep_memory.py; wide random Qwen2)."""
import os

import pytest

from tests.gpu import common
from tests.gpu.results import load, run_of

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")

SHIM_CONFIGS = ("shim", "shim-alloc-conf", "shim-cuda-conf", "shim-live", "shim-graphs")
# Goal (issue 7): under 1% on sleep + wake; bound configurable for noisy machines.
MAX_OVERHEAD = float(os.environ.get("SHIM_GPU_MAX_SLEEP_OVERHEAD", "0.01"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_sleep_memory", tmp_path_factory)


@pytest.mark.parametrize("name", ("vllm", *SHIM_CONFIGS))
def test_every_sleep_frees_what_the_pool_tracks(data, name):
    run = run_of(data, name)
    levels = {s["level"] for s in run["sleeps"]}
    assert levels == {1, 2}
    for s in run["sleeps"]:  # the first sleep included
        assert s["tracked"] > 1 << 30
        assert s["freed"] >= 0.99 * s["tracked"], s
        assert s["greedy_same"], s


@pytest.mark.parametrize("name", SHIM_CONFIGS)
def test_users_allocator_setting_is_back(data, name):
    run = run_of(data, name)
    assert run["settings_restored"], (run["settings_before"], run["settings_end"])
    assert all(s["settings_same_asleep"] and s["settings_same_awake"] for s in run["sleeps"])


@pytest.mark.parametrize("name", SHIM_CONFIGS)
def test_shim_figures_agree_with_mem_get_info(data, name):
    run = run_of(data, name)
    agreement = run["shim_vs_mem_get_info"]
    if not agreement.get("n"):
        pytest.skip(f"no shim sleep events in {name} (decisions: {run.get('decisions')})")
    assert agreement["n_shim"] == agreement["n_script"]
    assert agreement["within_1pct"], agreement
    assert agreement["all_effective"], agreement


def test_memory_outside_the_pool_with_cuda_graphs_is_reported(data):
    run = run_of(data, "shim-graphs")
    assert not run["eager"]
    assert run["init"]["outside_pool_bytes"] is not None


@pytest.mark.parametrize("level", (1, 2))
def test_sleep_wake_overhead(data, level):
    """The shim's own seconds around sleep + wake (its trace's ``shim_s``: measurements, the gc +
    ``empty_cache`` before a wake, bookkeeping) against vLLM's sleep + wake seconds, medians of the
    cycles. The A/B of two processes (``shim overhead`` row) is printed, not asserted: run-to-run
    noise of a 20-70 ms call is larger than the 1% asked."""
    own = run_of(data, "shim")["shim_own_time"]
    sleep, wake = own[f"sleep L{level}"], own[f"wake L{level}"]
    overhead = (sleep["shim_s"] + wake["shim_s"]) / (sleep["call_s"] + wake["call_s"])
    assert overhead <= MAX_OVERHEAD, f"level {level}: {overhead:.2%} ({sleep}, {wake})"
