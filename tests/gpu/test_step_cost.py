"""What the shim costs a GRPO step on a real GPU (bench/gpu_step_cost.py; wide random Qwen2)."""
import os

import pytest

from tests.gpu import common
from tests.gpu.results import load, run_of

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")

# Goal (issue 7): at most 1.0 against TRL 1.10.0; the bound leaves room for run-to-run noise.
MAX_RATIO = float(os.environ.get("SHIM_GPU_MAX_STEP_RATIO", "1.10"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_step_cost", tmp_path_factory)


def test_step_time_with_shim_against_upstream_fix(data):
    def seconds(label):  # median of the steps after the first (older records: the mean)
        run = run_of(data, label)
        return run.get("step_s_median_after_first") or run["step_s_mean_after_first"]

    shim, upstream = seconds("1.9.2 sleep on + shim"), seconds("1.10.0 sleep on")
    assert shim / upstream <= MAX_RATIO, (shim, upstream)


def test_shim_pushes_once_per_step(data):
    shim = run_of(data, "1.9.2 sleep on + shim")
    upstream = run_of(data, "1.10.0 sleep on")
    assert shim["pushes"] == upstream["pushes"] == shim["steps"]


def test_trace_report_and_plot(data):
    rep = data.get("report") or {}
    if rep.get("skipped"):
        pytest.skip(rep["skipped"])
    assert rep.get("rc") == 0, rep
    assert rep.get("png_written"), rep
