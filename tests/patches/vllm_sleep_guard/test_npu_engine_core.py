"""vllm-ascend's ``NPUWorker`` in an engine core of its own (``AsyncLLM`` on Ascend: verl, OpenRLHF):
``vllm-ascend-worker-sleep-guard`` / ``vllm-ascend-worker-sleep-check`` (patches/vllm_sleep_guard.py).

The real ``NPUWorker`` subclasses vLLM's ``WorkerBase``, not ``gpu_worker.Worker`` (vllm-ascend 0.23.0
``worker/worker.py:89``), and defines ``__init__``, ``sleep``, ``wake_up``, ``load_model`` and
``initialize_from_config`` itself: the records on ``Worker`` reach none of it. The stand-in in NPU mode
(tests/fakevllm/npu) keeps those methods its own likewise. ms-swift #6636's route: expandable segments on
through ``PYTORCH_ALLOC_CONF`` (NPU's caching allocator bypasses the sleep pool with them on).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.stand_in import run

GiB = 1 << 30
BODY = Path(__file__).parent / "children" / "npu_engine_core.py"  # a stand_in body


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _run(model_dir, folder: Path, shim: bool):
    r, proc = run(model_dir, BODY, shim=shim, device="npu", PYTORCH_ALLOC_CONF="expandable_segments:True",
                  FAKEVLLM_EVENTS=str(folder / "events.jsonl"), SHIM_TRACE=str(folder / "trace.jsonl"))
    sleeps = [e for e in _lines(folder / "events.jsonl") if e["event"] == "worker_sleep" and e["pid"] == r["core"]]
    return r, sleeps, _lines(folder / "trace.jsonl"), proc.stderr


def test_npu_worker_in_engine_core_guarded_and_checked(model_dir, tmp_path):
    (tmp_path / "off").mkdir(), (tmp_path / "on").mkdir()
    # shim off: the pool gets nothing, both sleeps free ~0 in the engine core, and nobody says so
    r, sleeps, trace, stderr = _run(model_dir, tmp_path / "off", shim=False)
    assert r["core"] != r["parent"] and trace == [] and "[shim]" not in stderr
    assert len(sleeps) == 2 and all(e["freed_bytes"] < GiB and e["pool_bytes"] == 0 for e in sleeps)
    # shim on: the guard ran around the NPUWorker's allocations (the sleep frees the pool) and its check
    # recorded each sleep from the engine core's pid
    r, sleeps, trace, stderr = _run(model_dir, tmp_path / "on", shim=True)
    assert len(sleeps) == 2 and all(e["freed_bytes"] >= 0.9 * e["pool_bytes"] > 10 * GiB for e in sleeps), stderr
    records = [t for t in trace if t["event"] == "sleep" and t["pid"] == r["core"]]
    assert len(records) == 2 and all(t["engine"].startswith("NPUWorker#") and t["effective"] for t in records), trace
    assert records[0]["measured"] == "device" and records[0]["freed"] >= 0.9 * records[0]["tracked"]
