"""Faults inside a wrapped vLLM call (issue 10 item 9), for every wrapper the vLLM patches install.

``patches/vllm_sleep_guard.py`` wraps ``LLMEngine.__init__`` / ``sleep`` / ``wake_up``
(``vllm-sleep-guard``: allocator guard on ``__init__`` and ``wake_up``; ``vllm-sleep-check``:
all three) and ``LLM.__init__`` / ``sleep`` / ``wake_up`` (``vllm-llm-sleep-check``). Each case
makes one of them the wrapper that acts, then lets the upstream call under it fail twice, in a
fresh interpreter on the vLLM stand-in (NPU mode, expandable segments on through
``PYTORCH_ALLOC_CONF`` and the live setting, so the allocator guard has something to suspend):

- construction: ``Worker.load_model`` raises (an unreadable checkpoint), then a
  ``KeyboardInterrupt`` there; the stand-in's ``load_model`` runs inside
  ``CuMemAllocator.use_memory_pool("weights")`` as vLLM's ``gpu_worker.Worker.load_model`` does;
- sleep: ``CuMemAllocator.sleep`` raises (a CUDA error), then a ``KeyboardInterrupt`` there
  (mid level-2 sleep);
- wake: a real out-of-memory on the stand-in (the trainer holds the memory the re-map needs;
  ``CuMemAllocator.wake_up`` rolls back and re-raises, as vLLM's does), then a
  ``KeyboardInterrupt`` in ``CuMemAllocator.wake_up``.

After each fault: the caller got the very exception raised below the wrappers, the user's
allocator setting (every env var, the live setting) is back, and the shim's sleep state says
what vLLM's executor says is asleep (and, after a failed level-2 sleep, that the weights may be
discarded, so the TRL proxy pushes before the next generate). Then a sleep frees what the pool tracks, the wake works,
the engine generates, the setting is still the user's.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm_scenario import VALUE, scenario


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


FAULT_BODY = Path(__file__).parent / "children" / "sleep_fault.py"  # a vllm_scenario body

CASES = {
    # wrapper that acts: (entry object, fault, patches switched off)
    "LLM.__init__": ("llm", "init", "vllm-sleep-check"),  # the LLM's own construction check acts
    "LLMEngine.__init__": ("engine", "init", ""),         # allocator guard + construction check
    "LLM.sleep": ("llm", "sleep", ""),                   # outermost: LLM's check; LLMEngine's passes through
    "LLMEngine.sleep": ("engine", "sleep", ""),           # ms-swift's path
    "LLM.wake_up": ("llm", "wake", ""),                   # LLM's check outermost, allocator guard inside
    "LLMEngine.wake_up": ("engine", "wake", ""),          # allocator guard + check on the engine
}
EXPECTED = {"init": [("error", "RuntimeError"), ("interrupt", "KeyboardInterrupt")],
            "sleep": [("error", "RuntimeError"), ("interrupt", "KeyboardInterrupt")],
            "wake": [("oom", "OutOfMemoryError"), ("interrupt", "KeyboardInterrupt")]}


@pytest.mark.parametrize("wrapper", list(CASES))
def test_fault_inside_wrapped_call(model_dir, wrapper):
    entry, fault, disabled = CASES[wrapper]
    env = dict(FAKEVLLM_DEVICE="npu", PYTORCH_ALLOC_CONF=VALUE, ENTRY=entry, FAULT=fault,
               SHIM_DISABLED_PATCHES=disabled, TEST_VALUE=VALUE)
    out, proc = scenario(model_dir, FAULT_BODY, shim=True, check=False, **env)
    assert proc.returncode == 0 and out is not None, proc.stderr[-3000:]
    assert [(f["label"], f["type"]) for f in out["faults"]] == EXPECTED[fault], out["faults"]
    for f in out["faults"]:
        if f["same"] is not None:
            assert f["same"] is True, f  # the very exception raised below the wrappers
        assert f["settings_ok"], f  # the user's allocator setting is back, never left suspended
        if "state" in f:
            assert f["state"]["shim"] == f["state"]["vllm"] and f["state"]["call_cleared"], f
    if fault == "sleep":  # a level-2 sleep that failed may have discarded weights: they count as discarded
        assert [f["state"]["weights_valid"] for f in out["faults"]] == [True, False], out["faults"]
    if fault == "wake":  # the failed wakes woke nothing
        assert all(f["state"]["vllm"] == ["kv_cache", "weights"] for f in out["faults"]), out["faults"]
    after = out["after"]
    assert after["tracked"] > 10 << 30 and after["freed"] >= 0.9 * after["tracked"], after
    assert after["asleep"]["shim"] == after["asleep"]["vllm"] == ["kv_cache", "weights"], after
    assert after["awake"]["shim"] == after["awake"]["vllm"] == [] and after["settings_ok"], after
    if entry == "llm":
        assert after["tokens"] == 3
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
