"""``shim.vllm.weights.caches.reset_encoder_caches_async`` in process, on a minimal engine with ``AsyncLLM``'s
two coroutine resets: a reset that raises is one WARNING and the other still runs (``SHIM_STRICT=1``: raised); no
``reset_encoder_cache`` (vLLM < 0.16): one WARNING per engine."""
import asyncio

import pytest

from shim.engine import log
from shim.vllm.weights import caches


class Engine:
    def __init__(self, failing=()):
        self.calls, self.failing = [], failing

    async def reset_mm_cache(self):
        self.calls.append("mm")
        if "mm" in self.failing:
            raise RuntimeError("mm reset broke")

    async def reset_encoder_cache(self):
        self.calls.append("encoder")


class OldEngine:  # vLLM < 0.16: AsyncLLM without reset_encoder_cache
    async def reset_mm_cache(self):
        pass


@pytest.fixture
def warnings(monkeypatch):
    lines = []
    monkeypatch.setattr(log, "warning", lines.append)
    monkeypatch.delenv("SHIM_STRICT", raising=False)
    return lines


def test_both_reset_in_verl_0_9_0s_order(warnings):
    engine = Engine()
    assert asyncio.run(caches.reset_encoder_caches_async(engine, "volcengine/verl#6523")) == ["mm", "encoder"]
    assert engine.calls == ["mm", "encoder"] and warnings == []


def test_a_failing_reset_warns_and_the_other_runs_strict_raises(warnings, monkeypatch):
    engine = Engine(failing=("mm",))
    assert asyncio.run(caches.reset_encoder_caches_async(engine, "volcengine/verl#6523")) == ["encoder"]
    assert engine.calls == ["mm", "encoder"]
    assert len(warnings) == 1 and "reset_mm_cache after a weight update failed" in warnings[0]
    monkeypatch.setenv("SHIM_STRICT", "1")
    with pytest.raises(RuntimeError, match="SHIM_STRICT=1"):
        asyncio.run(caches.reset_encoder_caches_async(Engine(failing=("mm",)), "volcengine/verl#6523"))


def test_no_encoder_reset_one_warning_per_engine(warnings):
    engine = OldEngine()
    for _ in range(3):
        assert asyncio.run(caches.reset_encoder_caches_async(engine, "volcengine/verl#6523")) == ["mm"]
    assert len(warnings) == 1 and "no reset_encoder_cache (added in 0.16.0)" in warnings[0]
    assert "volcengine/verl#6523" in warnings[0]
