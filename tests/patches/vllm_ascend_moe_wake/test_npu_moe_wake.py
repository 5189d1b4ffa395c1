"""vllm-ascend's wake re-lays the MoE expert weights (vllm-ascend#11548, #12226; patch
``vllm-ascend-moe-wake-layout``, ``shim.vllm.weights.moe_layout``), on the REAL ``NPUWorker.wake_up``.

The stand-in in NPU mode runs the ``NPUWorker.wake_up`` of a real vllm-ascend release: the method is
read from the release's wheel (``tests/support/ascend_src.py``) and compiled against the stand-in's
allocator, config and model (``FAKEVLLM_ASCEND_WORKER_SRC``, tests/fakevllm ``vllm._fake.real_code``);
the module itself cannot be imported on CPU (torch_npu's CANN extensions, vLLM internals). The model is
a tiny Qwen3-MoE whose experts the stand-in fuses as vLLM does and lays out as vllm-ascend's
``AscendUnquantizedFusedMoEMethod.process_weights_after_loading`` does; its forward is the grouped
matmul on that layout, so weights in another layout fail with a shape mismatch. ``VLLM_ASCEND_ENABLE_NZ=0``
as RL users run (the real ``wake_up`` refuses the NZ format).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.support.ascend_src import worker_source
from tests.support.helpers import REPO
from tests.support.stand_in import run

BODY = Path(__file__).parent / "children" / "moe_cycles.py"  # a stand_in body


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from tests.tiny import make_tiny_moe_model

    return make_tiny_moe_model(str(tmp_path_factory.mktemp("moe") / "m"), seed=0)


def moe_run(moe_dir, release, shim, **env):
    return run(moe_dir, BODY, shim=shim, device="npu", ascend=release, FAKEVLLM_ASCEND_WORKER_SRC=worker_source(release),
               VLLM_ASCEND_ENABLE_NZ="0", **env)


@pytest.mark.parametrize("release", ["0.13.0", "0.23.0", "0.25.1rc1"])
def test_real_wake_relays_moe_weights_and_the_shim_keeps_them(moe_dir, release):
    off, _ = moe_run(moe_dir, release, shim=False)
    assert off["n_experts"] == 4 and off["shapes"] == [[4, 24, 32], [4, 32, 48]]  # processed: [E,I,H], [E,H,2I]
    first = off["cycles"][0]
    # the bug: new Parameters, transposed out of the processed layout, attributes gone, the forward fails
    assert first["same_objects"] is False and first["attributes_kept"] is False
    assert first["shapes"] == [[4, 32, 24], [4, 48, 32]]
    assert "shapes cannot be multiplied" in first["fault"], first
    on, proc = moe_run(moe_dir, release, shim=True)
    assert on["decision"] == "applied", proc.stderr[-2000:]
    for cycle in on["cycles"]:
        assert cycle["same_objects"] is True and cycle["attributes_kept"] is True, cycle
        assert cycle["shapes"] == on["shapes"] and "fault" not in cycle, cycle
    assert on["cycles"][0]["tokens"] == on["cycles"][1]["tokens"] == on["before"]  # level 1: the same weights
    assert "vllm-ascend wake_up re-laid 4 MoE expert weights (vllm-ascend#11548)" in proc.stderr


def test_disabled_patch_leaves_the_relayout(moe_dir):
    off, _ = moe_run(moe_dir, "0.23.0", shim=True, SHIM_DISABLED_PATCHES="vllm-ascend-moe-wake-layout")
    assert off["decision"].startswith("disabled")
    assert off["cycles"][0]["same_objects"] is False and "shapes cannot be multiplied" in off["cycles"][0]["fault"]


def test_fixed_release_stands_down_and_keeps_its_own_layout(moe_dir):
    """vllm-ascend 0.26.0rc1 (PR #13012): ``wake_up`` no longer re-lays, ``process_weights_after_loading`` keeps
    the Parameters; the patch stands down and the release's own wake keeps everything."""
    on, proc = moe_run(moe_dir, "0.26.0rc1", shim=True)
    assert on["decision"] == "stand down: fixed upstream in 0.26.0rc1", on["decision"]
    assert all(c["same_objects"] and "fault" not in c for c in on["cycles"]), on["cycles"]
    assert on["cycles"][0]["tokens"] == on["before"]
    assert "re-laid" not in proc.stderr


def _real_code():
    spec = importlib.util.spec_from_file_location(
        "fakevllm_real_code", REPO / "tests" / "fakevllm" / "vllm" / "_fake" / "real_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release,expected", [
    ("0.13.0", None), ("0.23.0", None), ("0.25.1rc1", None),
    ("0.26.0rc1", "fixed upstream (wake_up no longer re-lays the MoE expert weights)")])
def test_probe_reads_the_real_wake_up(release, expected):
    """The probe on each release's own ``NPUWorker.wake_up`` source (the range aside)."""
    import typing

    from shim.vllm.weights import moe_layout

    names = {"torch": None, "CaMemAllocator": None, "get_ascend_config": None, "envs_ascend": None,
             "Optional": typing.Optional}
    wake_up = _real_code().method(worker_source(release), "NPUWorker", "wake_up", names)
    assert moe_layout.probe_relayout(type("NPUWorker", (), {"wake_up": wake_up})) == expected
