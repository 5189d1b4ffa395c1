"""ms-swift 3.x ``--offload_model`` under ZeRO-3 frees nothing before vLLM starts (ms-swift#7801), on real code.

Each case runs ``tests/scenarios/swift_offload_run.py`` in a fresh interpreter of an ms-swift
venv (real ms-swift, transformers and deepspeed 0.19.8 on CPU, one rank): the trainer model is
loaded under ZeRO-3 (``zero.Init``: every parameter a ``ds_tensor`` partition and an empty
``param.data``), then the release's own vLLM construction runs inside ``GRPOTrainer.offload_context``
(``offload_model`` -> engine build -> first sleep -> ``load_model``). The partitions are device
memory of the stand-in's fake GPU (``tests/support/residency.py``: where DeepSpeed puts them on
CUDA, with CUDA's semantics for ``Tensor.to``), sized so that they take half of it;
``vllm_gpu_memory_utilization=0.6``, so vLLM's start-up check (free memory after ``empty_cache``
>= 0.6 x total) passes only when the offload gave their memory back.

On 3.10.1 the run goes on to the offload around a rollout once the DeepSpeed engine (ZeRO-3 optimizer)
exists (``check_trained_model``).

3.12.3 carries upstream's fix (``test_upstream_fix_3_12_3``).

One release per code shape: 3.10.1 (``RolloutTrainerMixin.offload_model``, 3.10.0-3.12.2) and 3.9.3
(``GRPOTrainer``'s own copy, 3.5.1-3.9.x). The bug is shown on 3.10.1 only: the two releases'
``offload_model``/``load_model`` are the same source, byte for byte (read in the wheels).
"""
from __future__ import annotations

import tempfile

import pytest

from tests.support.helpers import REPO
from tests.support.swift_support import run_in_swift, tiny_model

SCENARIO = REPO / "tests" / "scenarios" / "swift_offload_run.py"
PATCH = {"3.10.1": "swift-zero3-offload", "3.9.3": "swift-grpo-zero3-offload"}


def run(version: str, *args: str) -> dict:
    out = tempfile.mkdtemp(prefix=f"swift-{version}-offload-")
    return run_in_swift(version, [SCENARIO, "--model", tiny_model(), "--out", out, *args],
                        env={"FAKEVLLM_CONTEXT_MB": "0"})


def test_offload_frees_nothing_without_shim():
    r = run("3.10.1")
    assert r["partition_bytes"] > 0 and r["partitions"] > 0
    # offload_model ran (inside offload_context) and every byte of the partitions is still on the GPU
    assert r["partition_bytes_on_device_at_build"] == r["partition_bytes"], r
    assert r["free_before_build"] == r["device_total"] - r["partition_bytes"]
    # so vLLM refuses to start, with its own message
    assert r["error"] is not None and r["error"][0] == "ValueError", r
    assert "less than desired GPU memory utilization (0.6" in r["error"][1]
    assert r["engine_built"] is False
    assert r["offload_wrapped_by"] is None and not r["decisions"]


@pytest.mark.parametrize("version", ["3.10.1", "3.9.3"])
def test_offload_frees_partitions_with_shim(version):
    r = run(version, "--shim", *(["--train-engine"] if version == "3.10.1" else []))
    # at the engine build every partition is off the GPU: the device is all free again
    assert r["partition_bytes_on_device_at_build"] == 0, r
    assert r["free_before_build"] == r["device_total"]
    assert r["error"] is None and r["engine_built"] is True, r
    # after offload_context, load_model put every partition back on the GPU, values bit for bit
    assert r["partitions_resident_after"] == r["partitions"], r
    assert r["partition_bytes_on_device_after"] == r["partition_bytes"]
    assert r["values_kept"] is True
    patch = PATCH[version]
    assert r["decisions"][patch] == "applied"
    assert r["offload_wrapped_by"] == patch and r["load_wrapped_by"] == patch
    if version == "3.10.1":  # the same wrappers on 3.9.3
        check_trained_model(r["train"], r["partition_bytes"])


def check_trained_model(train, partition_bytes):
    """Once ``train()`` built the DeepSpeed engine, ZeRO-3's optimizer holds the trained model's partitions
    in one flat buffer and every ``ds_tensor`` is a view into it. A copy of a view frees nothing (the buffer
    keeps the memory: as with ms-swift 4.0.0's fix, asserted as the limit it is), and 4.0.0's ``load_model``
    would put a second copy of every partition on the device until the next optimizer step; the shim leaves
    the views alone: the device holds the buffer once, before, inside and after ``offload_context``."""
    assert train["views_in_buffer"] > 0 and train["buffer_bytes"] == partition_bytes, train
    assert train["used_inside"] == train["used_before"], train  # the limit: nothing freed
    assert train["used_after"] == train["used_before"], train   # and nothing held twice
    assert train["views_after"] == train["views_in_buffer"] and train["values_kept"] is True, train


def test_upstream_fix_3_12_3():
    """3.12.3 (the 4.0.0 fix, same code): with only this patch active and its range widened past the fix,
    the probe stands it down, nothing wrapped. Upstream's own fix passes the same observation as the shim's
    (so the stand-in tells a real fix from the bug), and, once the DeepSpeed engine exists, its
    ``load_model`` leaves a second copy of every partition on the device (the buffer's views re-pointed to
    new device tensors): what ``check_trained_model`` asserts the shim avoids."""
    r = run("3.12.3", "--wide-probe", "--train-engine")
    assert r["decisions"] == {"swift-zero3-offload": "stand down: fixed upstream (RolloutTrainerMixin.offload_model "
                                                     "moves ds_tensor)"}, r["decisions"]
    assert r["offload_wrapped_by"] is None and r["load_wrapped_by"] is None
    assert r["partition_bytes_on_device_at_build"] == 0 and r["error"] is None and r["engine_built"] is True, r
    assert r["partitions_resident_after"] == r["partitions"] and r["values_kept"] is True, r
    train = r["train"]
    assert train["used_inside"] == train["used_before"], train
    assert train["used_after"] == train["used_before"] + r["partition_bytes"] and train["views_after"] == 0, train



class _Failing:
    """A ZeRO-3 partition's data whose move fails (a device error in the middle of the offload)."""

    def to(self, *a, **k):
        raise RuntimeError("device error")


class _Model:
    def parameters(self):
        param = type("Param", (), {})()
        param.ds_tensor = type("Partition", (), {"data": _Failing()})()
        return [param]


@pytest.mark.parametrize("strict", ("0", "1"))
def test_a_failing_partition_move_never_stops_training(monkeypatch, strict, caplog):
    """The shim's moves come after ms-swift's own ``offload_model``: their exception is one WARNING,
    ms-swift's result comes back (``SHIM_STRICT=1``: it raises)."""
    from shim.engine import log
    from shim.swift import zero3_offload

    monkeypatch.setenv("SHIM_STRICT", strict)
    monkeypatch.setattr(zero3_offload, "_owns_storage", lambda t: True)
    offload_model, _ = zero3_offload.wrappers(lambda: "cpu")
    warnings = []
    monkeypatch.setattr(log, "warning", warnings.append)
    upstream = lambda model: "ms-swift's result"  # noqa: E731
    if strict == "1":
        with pytest.raises(RuntimeError, match="device error"):
            offload_model(upstream, None, (_Model(),), {})
        return
    assert offload_model(upstream, None, (_Model(),), {}) == "ms-swift's result"
    assert len(warnings) == 1 and "offload of the ZeRO-3 partitions failed" in warnings[0], warnings
