"""NPU device memory grows every sleep/wake cycle (vllm-project/vllm-ascend#9563).

vllm-ascend before 0.19.1rc1 (``CaMemAllocator.sleep`` without gc + ``torch.npu.empty_cache``,
added by PR #7709) leaves the blocks freed during a sleep in the caching allocator; the issue
reports ~240 MB more device memory after every wake until OOM. The stand-in models it in NPU
mode (``FAKEVLLM_NPU_WORKSPACE_MB``: a workspace allocated at each KV-cache wake and freed at the
sleep; cached blocks left across a wake are not reused). The shim's sleep check
(``vllm-sleep-check`` / ``vllm-llm-sleep-check``, ``shim.vllm_guard.measure_after_sleep``) collects
and empties the NPU cache after every sleep: the fix was already there, this proves it.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stand_in import run

CYCLES = 50
WORKSPACE_MB = 240
BODY = Path(__file__).parent / "children" / "npu_cycles.py"  # a stand_in body
ENV = dict(FAKEVLLM_NPU_WORKSPACE_MB=WORKSPACE_MB, TEST_CYCLES=CYCLES)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def test_50_cycles_grow_without_the_shim_flat_with_it(model_dir):
    off, _ = run(model_dir, BODY, shim=False, device="npu", **ENV)
    # the bug: one workspace more per cycle (49 intervals)
    assert off["growth_mb"] == pytest.approx((CYCLES - 1) * WORKSPACE_MB)
    on, proc = run(model_dir, BODY, shim=True, device="npu", **ENV)
    assert on["growth_mb"] == 0 and on["cached_mb"] == 0, proc.stderr
    disabled, _ = run(model_dir, BODY, shim=True, device="npu",
                      SHIM_DISABLED_PATCHES="vllm-sleep-check,vllm-llm-sleep-check,vllm-ascend-worker-sleep-check", **ENV)
    assert disabled["growth_mb"] == pytest.approx((CYCLES - 1) * WORKSPACE_MB)


def test_fixed_vllm_ascend_is_flat_without_the_shim(model_dir):
    """The stand-in's model of the upstream fix (vllm-ascend 0.19.1rc1+, PR #7709)."""
    off, _ = run(model_dir, BODY, shim=False, device="npu", ascend="0.19.1rc1", **ENV)
    assert off["growth_mb"] == 0


def test_after_sleep_release_alone_keeps_it_flat(model_dir):
    """With vLLM >= 0.30 the shim skips its own release before a wake (vLLM's CUDA worker does it),
    so on NPU only the release after each sleep stands between the cache and the leak."""
    on, proc = run(model_dir, BODY, shim=True, version="0.31.0", device="npu", ascend="0.13.0rc1", **ENV)
    assert on["growth_mb"] == 0 and on["cached_mb"] == 0, proc.stderr
