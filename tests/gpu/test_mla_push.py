"""Issue 19 items 1 and 2 on a real GPU and real vLLM 0.24: MLA derived matrices after a TRL-style push.

Numbers from bench/gpu_mla_push.py (its docstring: the three steps, the modes, the expectations):
a tiny random DeepSeek-V2, TRL's raw per-tensor ``model.load_weights`` push, each step compared with
a fresh engine (no sleep mode) loaded from the pushed weights on disk.
"""
import pytest

from tests.gpu import common
from tests.gpu.results import load

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_mla_push", tmp_path_factory)


def check(data, run):
    checks = {c["run"]: c for c in data["checks"]}
    if run not in checks:
        pytest.skip(f"{run} not in the results")
    assert checks[run]["pass"], checks[run]


def test_bf16_derived_matrices_are_views_no_push_leaves_them_stale(data):
    for mode in ("off", "tensors", "on"):
        check(data, f"bf16/{mode}")


def test_quantized_kv_b_proj_raw_push_leaves_them_stale(data):
    check(data, "fp8kv/off")


def test_level2_sleep_keeps_the_plain_tensors(data):
    check(data, "fp8kv/tensors")


def test_push_through_the_reload_session_matches_a_fresh_engine(data):
    check(data, "fp8kv/on")
