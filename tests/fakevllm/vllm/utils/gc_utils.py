"""vLLM's ``vllm/utils/gc_utils.py`` (the stand-in's subset): ``freeze_gc_heap``, as in 0.24.0 (lines 96-108).

Where vLLM calls it (read in the 0.24.0 wheel): the end of ``EngineCore.__init__`` (``v1/engine/core.py:232``;
moved there from ``EngineCoreProc`` by PR #27896, so an in-process engine under ``external_launcher`` freezes
the trainer's heap too) and the end of the worker's ``compile_or_warm_up_model`` (``v1/worker/gpu_worker.py:774``,
PR #44363); ``EngineCore.shutdown`` undoes it (``core.py:656``). Everything alive at that moment moves to the
permanent generation: later full collections (``CuMemAllocator.sleep`` ends with one) skip it, so they cost
little, and cycles created later are still collected.
"""
from __future__ import annotations

import gc

from vllm import _fake

ENGINE_CORE_FREEZES = _fake.V >= _fake.Version("0.12.0")
"""PR #27896 (merged 2025-10-31) is in 0.12.0; before it only ``EngineCoreProc`` froze (PR #24008)."""
WORKER_FREEZES = _fake.V >= _fake.Version("0.24.0")
"""PR #44363 (merged 2026-06); 0.24.0 has it (the earliest release checked)."""


def freeze_gc_heap() -> None:
    gc.collect(0)
    gc.collect(1)
    gc.collect(2)
    gc.freeze()
