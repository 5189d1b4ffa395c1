"""The allocator guard and the user's other allocator options on vLLM 0.33+ (patches/vllm_sleep_guard.py).

vLLM 0.33 and 0.34 turn expandable segments off around the sleep pool themselves, on every route (the live
config, else ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_HIP_ALLOC_CONF``), by rewriting the
WHOLE allocator string with one field flipped (``device_allocator/alloc_conf.py``): torch resets
``max_split_size_mb``, ``garbage_collection_threshold`` and ``roundup_power2_divisions`` whenever a string
leaves them out. The guard's live write (``expandable_segments:False`` then ``:True``) would leave them out,
so on CUDA the guard records stand down there; on NPU (vllm-ascend only asserts) they apply.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stand_in import run

BODY = Path(__file__).parent / "children" / "alloc_options.py"  # a stand_in body
USER = "expandable_segments:True,max_split_size_mb:256"
FIXED = "stand down: fixed upstream: vLLM turns expandable segments off itself on every route"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_cuda_user_options_survive(model_dir, version):
    off, proc = run(model_dir, BODY, shim=False, version=version, PYTORCH_CUDA_ALLOC_CONF=USER)
    assert off is not None, proc.stderr
    # vLLM alone: the pool gets the memory and the user's options stay (the stand-in models 0.33's fix)
    assert off["in_pool"] is True and off["freed_gib"] > 1
    assert off["after_wake"]["max_split_size_mb"] == "256" and off["after_wake"]["expandable_segments"] == "True"
    on, proc = run(model_dir, BODY, shim=True, version=version, PYTORCH_CUDA_ALLOC_CONF=USER, TEST_FORCE_GUARD="1")
    assert on is not None, proc.stderr
    for when in ("after_build", "after_wake"):
        assert on[when].get("max_split_size_mb") == "256" and on[when]["expandable_segments"] == "True", (when, on)
    assert on["decisions"]["vllm-sleep-guard"].startswith(FIXED), on["decisions"]
    assert on["decisions"]["vllm-worker-sleep-guard"].startswith(FIXED), on["decisions"]
    assert on["in_pool"] is True and on["freed_gib"] > 1
    # why it stands down: the guard's own live write, were it run here, drops the user's option
    assert "max_split_size_mb" not in on["after_forced_guard"]
    assert on["after_forced_guard"]["expandable_segments"] == "True"


def test_npu_guard_still_applies(model_dir):
    """vllm-ascend's CaMemAllocator asserts on the env string and never toggles: the guard stays on NPU,
    whatever the vLLM version."""
    off, _ = run(model_dir, BODY, shim=False, version="0.34.0", device="npu", check=False,
                 PYTORCH_NPU_ALLOC_CONF="expandable_segments:True")
    assert off is None  # CaMemAllocator's assert
    on, proc = run(model_dir, BODY, shim=True, version="0.34.0", device="npu",
                   PYTORCH_NPU_ALLOC_CONF="expandable_segments:True")
    assert on is not None, proc.stderr
    assert on["decisions"]["vllm-sleep-guard"] == "applied"
    assert on["decisions"]["vllm-ascend-worker-sleep-guard"] == "applied"
    assert on["in_pool"] is True and on["freed_gib"] > 1


def test_guard_leaves_every_route_alone_where_vllm_covers(monkeypatch):
    """What ms-swift's rebound ``set_expandable_segments`` (``swift-expandable-segments``) and the worker guard
    reach: on CUDA with vLLM 0.33+ a suspend rewrites no env var and writes no live setting, and no route is
    reported as a risk; where vLLM does not cover the routes, the same suspend acts."""
    import os

    from shim.vllm.sleep import alloc_guard

    class Probe:
        name = "cuda"
        module = None

        def __init__(self):
            self.calls = []

        def set_allocator_settings(self, setting):
            self.calls.append(setting)
            return True

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", USER)
    monkeypatch.setattr(alloc_guard, "_reported", {"cuda": True})
    for covered, acts in (("fixed upstream: (test)", False), (None, True)):
        probe = Probe()
        monkeypatch.setitem(alloc_guard._covered, "cuda", covered)
        with alloc_guard.expandable_segments_off(probe):
            inside = os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        assert (inside != USER, bool(probe.calls), bool(alloc_guard.routes_on(probe))) == (acts, acts, acts)
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == USER
