"""vLLM 0.31+ releases the KV cache without a sleep (``release_kv_cache_memory`` -> ``Executor.discard`` ->
``Worker.discard``); verl and RL servers wake it with ``wake_up(["kv_cache"])``. The shim's worker check
must follow the discard: it once took ``kv_cache`` for awake and skipped the worker's wake vLLM asked for,
and the next rollout ran over an unmapped KV cache (``vllm-worker-sleep-check``). A sleep while only the KV
cache is discarded is not refused by 0.31+'s executor (only an asleep ``weights`` tag refuses it): the shim
must not re-map the KV cache first, and the sleep frees the weights, judged against what was still mapped.

One child program per run (``children/kv_discard.py``): an ``AsyncLLM`` with its engine core forked, then an
in-process ``LLM``; the stand-in imitates vLLM 0.33.0 and 0.34.0. Without the shim the rollouts work (the
stand-in models vLLM's own path), asserted in the same test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import stand_in

GiB = 1 << 30
CHILD = Path(__file__).parent / "children" / "kv_discard.py"
pytestmark = pytest.mark.xdist_group("kv_discard")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def _run(model_dir, folder: Path, shim: bool, version: str) -> dict:
    folder.mkdir()
    R, proc = stand_in.run(model_dir, CHILD, shim, version=version, check=False,
                           SHIM_TRACE=str(folder / "trace.jsonl"), FAKEVLLM_EVENTS=str(folder / "events.jsonl"),
                           TOKENIZERS_PARALLELISM="false")
    assert R is not None, proc.stderr[-3000:]

    def lines(path):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    R["trace"], R["events"], R["stderr"] = lines(folder / "trace.jsonl"), lines(folder / "events.jsonl"), proc.stderr
    return R


@pytest.mark.parametrize("version", ["0.31.0", "0.34.0"])
def test_kv_cache_released_without_a_sleep_is_woken(model_dir, tmp_path, version):
    off = _run(model_dir, tmp_path / "off", False, version)
    on = _run(model_dir, tmp_path / "on", True, version)
    tokens = off["async"]["first"]
    # shim off: vLLM's own path works, the rollout after the discard and the KV wake equals the first
    for R in (off, on):
        assert R["async"]["first"] == tokens and R["async"]["after_wake"] == tokens, R["async"]
    assert off["async"]["after_discard"] == tokens and off["llm"]["after_discard"] == tokens
    # shim on: the worker's wake of the KV cache reached vLLM's worker in the engine core, the rollout works
    core = on["async"]["core"]
    assert on["async"]["after_discard"] == tokens, on["async"]
    assert on["async"]["after_sleep"] == tokens and on["llm"]["after_discard"] == tokens
    assert on["llm"]["after_sleep"] == tokens
    woken = [e["tags"] for e in on["events"] if e["event"] == "allocator_wake_up" and e["pid"] == core]
    assert woken == [None, ["kv_cache"], None], woken
    wakes = [r for r in on["trace"] if r["event"] == "wake" and r["pid"] == core]
    assert [r["tags"] for r in wakes] == [["kv_cache", "weights"], ["kv_cache"], ["kv_cache", "weights"]], wakes


@pytest.mark.parametrize("version", ["0.34.0"])
def test_worker_wake_goes_through_as_vllm_asked(model_dir, tmp_path, version):
    """A KV cache released where the shim does not see it (the allocator's own ``discard``, vLLM's executor
    told): on vLLM >= 0.31 the executor has checked the tags, and the worker's check passes the wake on as
    asked, whatever its own record says (the record had ``kv_cache`` awake)."""
    off = _run(model_dir, tmp_path / "off", False, version)
    on = _run(model_dir, tmp_path / "on", True, version)
    tokens = off["llm"]["first"]
    assert off["llm"]["after_unseen_discard"] == tokens
    assert on["llm"]["after_unseen_discard"] == tokens, on["llm"]


@pytest.mark.parametrize("version", ["0.31.0", "0.34.0"])
def test_sleep_after_a_kv_discard_does_not_remap_it(model_dir, tmp_path, version):
    """Only the KV cache discarded, then ``sleep(1)``: 0.31+'s executor sleeps; the shim passes it through (no
    KV wake first) and judges the sleep against the bytes still mapped (the weights): effective, no WARNING."""
    on = _run(model_dir, tmp_path / "on", True, version)
    core = on["async"]["core"]
    assert on["llm"]["kv_wakes_at_sleep"] == on["llm"]["kv_wakes_before_sleep"], on["llm"]
    kv_wakes = [e for e in on["events"] if e["event"] == "allocator_wake_up" and e["pid"] == core
                and e["tags"] == ["kv_cache"]]
    assert len(kv_wakes) == 1, kv_wakes  # the one vLLM asked for, none before the sleep
    sleeps = [r for r in on["trace"] if r["event"] == "sleep" and r.get("level") == 1]
    assert len(sleeps) == 4, sleeps  # two per engine: the worker's in the core, the in-process engine's
    assert all(r["effective"] is True for r in sleeps), sleeps
    # the second sleep of each engine came after the discard: what it freed is the weights, not the KV cache
    # the discard had released already (the pool's bookkeeping would otherwise count it as freed twice)
    for engine in {r["engine"] for r in sleeps}:
        first, second = [r for r in sleeps if r["engine"] == engine]
        assert first["tracked"] > 10 * GiB and second["tracked"] < GiB and second["freed"] < GiB, (first, second)
    assert "ineffective sleep" not in on["stderr"], on["stderr"][-3000:]
    assert "was asleep: woke it first" not in json.dumps(sleeps)
