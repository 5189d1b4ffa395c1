"""ms-swift 4.x Megatron rollouts (MegatronRolloutMixin) and the Ray rollout engine: set_expandable_segments (#6636).

Both modules import ms-swift's CUDA-only ``set_expandable_segments`` BY NAME from
``swift.rlhf_trainers.utils`` (patches ``swift-expandable-segments-megatron`` / ``-ray``).
Each case runs the REAL ms-swift 4.6.0 modules in a fresh interpreter of its venv
(tests/support/swift_envs.py, with megatron-core 0.16.1) on the vLLM stand-in; shim off must
show the bug (asserted), shim on must fix it.

Not real here: ``mcore_bridge``. ms-swift's ``swift.megatron.model`` imports three
names from it, but mcore-bridge hard-imports NVIDIA Transformer Engine (its patcher,
LoRA tuners and model modules), which has no CPU build, and with TE absent
megatron-core leaves ``TEGroupedLinear = None``, which mcore-bridge's import-time
patcher then writes to. The child puts a names-only module in ``sys.modules``; the
code under test (engine build, first sleep, the helper calls) never calls it. The
rollout cycle (``_generate_completions``, ``tests/scenarios/swift_megatron_run.py``) pushes
the weights through the trainer's ``bridge``: the stand-in's ``HFLayoutBridge`` (``export_weights``
of a model already in HF layout).
"""
import json
from pathlib import Path

from tests.support.helpers import REPO
from tests.support.swift_support import AFTER_OFFLOAD, PUSH, run_in_swift, tiny_model, weights_wakes

VERSION = "4.6.0"
MEGATRON = "swift.megatron.trainers.rollout_mixin"
RAY = "swift.ray.megatron.rollout.ray_vllm_engine"
EXPANDABLE = "expandable_segments:True"
USER = "max_split_size_mb:128,expandable_segments:True"
SHIM_HELPER = "shim.swift.expandable_segments"
SWIFT_HELPER = "swift.rlhf_trainers.utils"

CHILD = Path(__file__).parent / "children" / "megatron_helper.py"


def run_child(spec: dict, env: dict) -> dict:
    return run_in_swift(VERSION, ["-c", CHILD.read_text(), json.dumps(spec)], env=env, vllm_version="0.24.0")


def test_megatron_helper_keeps_the_users_cuda_string():
    """ms-swift's helper (CUDA available) rewrites PYTORCH_CUDA_ALLOC_CONF whole: after (False) then (True) only
    ``expandable_segments:True`` is left, the user's max_split_size_mb is lost. With the shim: the user's string."""
    env = {"FAKEVLLM_DEVICE": "cuda", "PYTORCH_CUDA_ALLOC_CONF": USER}
    spec = {"mode": "helper", "modules": [MEGATRON], "cuda_available": True}
    off = run_child({**spec, "shim": False}, env)
    assert off["helpers"] == [SWIFT_HELPER, SWIFT_HELPER]
    assert off[MEGATRON]["off"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"
    assert off[MEGATRON]["on"]["PYTORCH_CUDA_ALLOC_CONF"] == EXPANDABLE != USER  # the bug: user's keys lost
    on = run_child({**spec, "shim": True}, env)
    assert on["decisions"]["swift-expandable-segments-megatron"] == "applied"
    assert on["helpers"] == [SHIM_HELPER, SHIM_HELPER]  # the mixin's name and utils (sleep_vllm_engine)
    assert on[MEGATRON]["off"]["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:False"
    assert on[MEGATRON]["on"]["PYTORCH_CUDA_ALLOC_CONF"] == USER


def test_megatron_and_ray_helpers_turn_npu_expandable_segments_off():
    """Ascend: the helper never looks at PYTORCH_NPU_ALLOC_CONF, so (False) leaves expandable segments on while
    vllm-ascend fills its pool. With the shim: off during (False), the user's string back at (True)."""
    env = {"FAKEVLLM_DEVICE": "npu", "PYTORCH_NPU_ALLOC_CONF": EXPANDABLE}
    spec = {"mode": "helper", "modules": [MEGATRON, RAY]}
    off = run_child({**spec, "shim": False}, env)
    assert off["helpers"] == [SWIFT_HELPER] * 3
    for module in (MEGATRON, RAY):
        assert off[module]["off"]["PYTORCH_NPU_ALLOC_CONF"] == EXPANDABLE  # the bug: not turned off
    on = run_child({**spec, "shim": True}, env)
    assert on["decisions"]["swift-expandable-segments-megatron"] == "applied"
    assert on["decisions"]["swift-expandable-segments-ray"] == "applied"
    assert on["helpers"] == [SHIM_HELPER] * 3
    for module in (MEGATRON, RAY):
        assert on[module]["off"]["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:False"
        assert on[module]["on"]["PYTORCH_NPU_ALLOC_CONF"] == EXPANDABLE


def test_megatron_first_sleep_frees_the_engine_6636():
    """The REAL MegatronRolloutMixin._init_rollout_engine (engine build + first sleep, colocate, level 1) on a bare
    instance, NPU with PYTORCH_ALLOC_CONF: without the shim the engine's memory misses the sleep pool and the first
    sleep frees ~0. With only this patch (vllm-sleep-guard, which would also catch the build, disabled): >= 90%,
    and the user's setting is back for training."""
    env = {"FAKEVLLM_DEVICE": "npu", "PYTORCH_ALLOC_CONF": EXPANDABLE}
    spec = {"mode": "init_engine", "modules": [MEGATRON], "level": 1, "model": tiny_model()}
    kv_bytes = 0.3 * 80 * 2**30 * 0.9  # the stand-in's KV cache alone (gpu_memory_utilization 0.3 of 80 GiB)
    off = run_child({**spec, "shim": False}, env)
    assert len(off["sleeps"]) == 1 and off["sleeps"][0]["freed"] < 0.01 * kv_bytes, off["sleeps"]
    on = run_child({**spec, "shim": True}, {**env, "SHIM_DISABLED_PATCHES": "vllm-sleep-guard,vllm-worker-sleep-guard"})
    assert on["decisions"]["swift-expandable-segments-megatron"] == "applied"
    assert len(on["sleeps"]) == 1, on["sleeps"]
    sleep = on["sleeps"][0]
    assert sleep["freed"] >= 0.9 * sleep["tracked"] and sleep["freed"] >= kv_bytes, on["sleeps"]
    assert on["after"]["PYTORCH_ALLOC_CONF"] == EXPANDABLE


SCENARIO = REPO / "tests" / "scenarios" / "swift_megatron_run.py"
RESAMPLE = "swift-megatron-resample-wake-order"


def run_megatron(version: str, *args: str) -> dict:
    """``tests/scenarios/swift_megatron_run.py`` (the real MegatronRolloutMixin rollouts) with ``args``."""
    return run_in_swift(version, [SCENARIO, "--model", tiny_model(), *args], vllm_version="0.24.0")


# ms-swift#10109 in the Megatron mixin: the same wake code in every 4.0.0-4.5.3 release (read in the wheels); 4.5.3
# stands for them (the venv's megatron-core 0.16.1 / mcore-bridge names are 4.5.x's and 4.6.0's).
def test_megatron_same_step_rollout_wakes_weights_after_offload_10109():
    """Level 1, --offload_model, two ``_generate_completions`` per step. The first rollout of a step pushes the trained
    weights through the bridge: the weights wake while the trainer is still on the device (needed for the push; 4.6.0
    too). The second needs no push, yet 4.5.3 wakes the weights before offload_context moved the trainer off: both
    on the device at once (asserted, from the trainer's resident bytes at the wake). With the shim it wakes them
    with the KV cache inside offload_context, as 4.6.0 does (test_megatron_resample_wake_order_stands_down_on_4_6_0);
    every rollout generates from the trainer's weights either way."""
    off = run_megatron("4.5.3", "--level", "1", "--offload")
    assert weights_wakes(off) == {0: [PUSH, PUSH], 1: [PUSH, PUSH]}, off["order"]
    same_step = [w for w in off["order"] if w["event"] == "wake_up"][2]  # step 0, second rollout: weights
    assert same_step["tags"] == ["weights"] and same_step["trainer_bytes"] > 0, off["order"]
    on = run_megatron("4.5.3", "--level", "1", "--offload", "--shim", "--probe", RESAMPLE)
    assert weights_wakes(on) == {0: [PUSH, AFTER_OFFLOAD], 1: [PUSH, AFTER_OFFLOAD]}, on["order"]
    assert on["decisions"][RESAMPLE] == "applied" and on["probes"][RESAMPLE] is None
    assert RESAMPLE in on["markers"]
    for run in (off, on):
        assert len(run["generates"]) == 4 and run["mismatches"] == 0, run["generates"]


def test_megatron_resample_wake_order_stands_down_on_4_6_0():
    """4.6.0 (PR #10109) wakes the weights early only before a push: the record stands down by version and by probe,
    nothing wrapped, the same order with and without the shim -- the order the shim gives 4.5.3."""
    off = run_megatron("4.6.0", "--level", "1", "--offload")
    on = run_megatron("4.6.0", "--level", "1", "--offload", "--shim", "--probe", RESAMPLE)
    assert on["decisions"][RESAMPLE] == "stand down: fixed upstream in 4.6.0"
    assert on["probes"][RESAMPLE] == ("fixed upstream (MegatronRolloutMixin._generate_completions wakes the weights "
                                      "early only before a push)")
    assert on["markers"] == []
    # the same moves and wakes (the device's used bytes aside: other patches empty the caching allocator's cache)
    moves = lambda run: [{k: v for k, v in e.items() if k != "used"} for e in run["order"]]  # noqa: E731
    assert moves(on) == moves(off) and weights_wakes(on) == {0: [PUSH, AFTER_OFFLOAD], 1: [PUSH, AFTER_OFFLOAD]}
    assert on["mismatches"] == 0 and off["mismatches"] == 0
