"""ms-swift 4.x ``offload_context`` loads models onto the device that it never offloaded (ms-swift#10109, #9793).

Each case runs ``tests/scenarios/swift_offload_reload_run.py`` in a fresh interpreter of an ms-swift 4.x venv: the
release's own ``GKDTrainer`` / ``GRPOTrainer`` builds vLLM (``_prepare_rollout_params`` + ``_prepare_vllm``:
``offload_context`` -> engine build -> first sleep -> reload) with the trained model still on the CPU, as before
``accelerator.prepare``; the device is the stand-in's fake GPU, ``Tensor.to`` with CUDA's semantics
(``tests/support/residency.py``). Shim off must show the bug (asserted), shim on must fix it.

Releases: 4.6.0 for GKD (its ``offload_context`` is the same source in 4.2.0-4.6.0, comments aside in 4.0.x-4.1.x;
4.6.0's ``offload_model`` returns whether it moved anything, which GKD ignores), 4.5.3 for GRPO (fixed in 4.6.0) and
for GKD with 4.0-4.5.x's ``offload_model`` (no return value, every tensor through ``.to('cpu')``).
"""
from __future__ import annotations

import tempfile

from tests.support.helpers import REPO
from tests.support.swift_support import run_in_swift, tiny_model

SCENARIO = REPO / "tests" / "scenarios" / "swift_offload_reload_run.py"
GKD, GRPO = "swift-gkd-offload-reload", "swift-grpo-offload-reload"


def run(version: str, *args: str) -> dict:
    out = tempfile.mkdtemp(prefix=f"swift-{version}-reload-")
    return run_in_swift(version, [SCENARIO, "--model", tiny_model(), "--out", out, *args])


def test_gkd_student_on_cpu_is_not_loaded_onto_the_device_4_6_0():
    """4.6.0 GKD: the student is on the CPU at vLLM's construction, so the offload moves nothing (4.6.0's
    offload_model says so: False), yet offload_context's exit loads the whole student onto the device (asserted: every
    byte of it resident, the device's free memory down by as much). With the shim it stays where it was. GRPO's record
    stands down on 4.6.0, by version and by probe (its offload_context reloads only what offload_model moved)."""
    off = run("4.6.0", "--trainer", "gkd")
    size = off["sizes"]["model"]
    assert off["before"]["resident"]["model"] == 0 and off["engine_asleep"]
    assert off["after_build"]["resident"]["model"] == size > 0, off  # the bug: loaded whole onto the device
    assert off["after_build"]["free"] <= off["before"]["free"] - size, off
    on = run("4.6.0", "--trainer", "gkd", "--shim", "--probe", GKD, "--probe", GRPO)
    assert on["after_build"]["resident"]["model"] == 0 and on["engine_asleep"], on
    assert on["after_build"]["free"] == on["before"]["free"], on
    assert on["decisions"][GKD] == "applied" and on["markers"] == [GKD]
    assert on["probes"] == {GKD: None, GRPO: "fixed upstream (GRPOTrainer.offload_context reloads only the models "
                                               "offload_model moved)"}
    assert on["decisions"][GRPO] == "stand down: fixed upstream in 4.6.0"


def test_gkd_rollout_offload_still_reloads_4_5_3():
    """4.5.3 GKD (offload_model returns nothing and copies every tensor it finds on the device): the student on the
    CPU at vLLM's construction is loaded onto the device without the shim (asserted) and stays on the CPU with it.
    Once on the device (accelerator.prepare), a rollout's offload_context moves it off and back, with and without the
    shim."""
    off = run("4.5.3", "--trainer", "gkd", "--rollout-offload")
    on = run("4.5.3", "--trainer", "gkd", "--rollout-offload", "--shim")
    size = off["sizes"]["model"]
    assert off["after_build"]["resident"]["model"] == size > 0, off
    assert on["decisions"][GKD] == "applied" and on["after_build"]["resident"]["model"] == 0, on
    for r in (off, on):
        assert r["rollout_before"]["resident"]["model"] == size, r
        assert r["rollout_inside"]["resident"]["model"] == 0, r  # offloaded during the rollout
        assert r["rollout_after"]["resident"]["model"] == size, r  # and loaded back


def test_grpo_reloads_only_the_models_it_moved_4_5_3():
    """4.5.3 GRPO, the policy on the CPU and the reference model on the device at vLLM's construction: the offload
    moves the reference model only, the exit loads both onto the device without the shim (asserted). With it: the
    reference model back on the device, the policy still on the CPU -- per model, as 4.6.0 does. Around a rollout
    (both on the device) both go off and come back, with and without the shim."""
    off = run("4.5.3", "--trainer", "grpo", "--ref-model", "--rollout-offload")
    on = run("4.5.3", "--trainer", "grpo", "--ref-model", "--rollout-offload", "--shim")
    sizes = off["sizes"]
    assert off["before"]["resident"] == {"model": 0, "ref_model": sizes["ref_model"]}
    assert off["after_build"]["resident"] == sizes, off  # the bug: the policy loaded onto the device too
    assert on["after_build"]["resident"] == {"model": 0, "ref_model": sizes["ref_model"]}, on
    assert on["decisions"][GRPO] == "applied" and on["markers"] == [GRPO]
    for r in (off, on):
        assert r["rollout_inside"]["resident"] == {"model": 0, "ref_model": 0}, r
        assert r["rollout_after"]["resident"] == sizes, r
