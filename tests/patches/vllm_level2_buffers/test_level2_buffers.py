"""Waking kv_cache before weights after a level-2 sleep (patches/vllm_level2_buffers.py).

vLLM < 0.27 and every vllm-ascend restore the buffers saved by ``sleep(level=2)`` (rope
``inv_freq`` / ``cos_sin_cache``) at ANY wake, so a ``kv_cache``-first wake copies them into
unmapped weight memory: CUDA_ERROR_ILLEGAL_ADDRESS (vllm#45619) / the NPU MTE fault (stand-in:
``Worker._wake_up_tag_blind``). No weight push could bring them back: the trainer's
``load_weights`` carries parameters only.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.stand_in import run

CHILDREN = Path(__file__).parent / "children"  # stand_in bodies
BODY = CHILDREN / "kv_cache_first.py"
BOTH_TAGS = CHILDREN / "both_tags.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def test_cuda_kv_cache_first_wake_keeps_buffers(model_dir):
    off, _ = run(model_dir, BODY, shim=False)
    assert off["n_buffers"] >= 1
    assert "illegal memory access" in off["fault"] and off["lost_events"] == 1  # the bug
    on, proc = run(model_dir, BODY, shim=True)
    assert on["kept"] is True and on["lost_events"] == 0 and on["same_output"] is True, proc.stderr
    disabled, _ = run(model_dir, BODY, shim=True, SHIM_DISABLED_PATCHES="vllm-level2-buffers")
    assert "illegal memory access" in disabled["fault"]


def test_npu_kv_cache_first_wake(model_dir):
    off, _ = run(model_dir, BODY, shim=False, device="npu")
    assert "MTE" in off["fault"]  # vllm-ascend: the restore writes into unmapped memory
    on, proc = run(model_dir, BODY, shim=True, device="npu")
    assert "fault" not in on and on["kept"] is True and on["same_output"] is True, proc.stderr
    disabled, _ = run(model_dir, BODY, shim=True, device="npu", SHIM_DISABLED_PATCHES="vllm-ascend-level2-buffers")
    assert "MTE" in disabled["fault"]


def test_stands_down_where_vllm_gates_the_restore(model_dir):
    on, proc = run(model_dir, (BODY, CHILDREN / "restore_probe.py"), shim=True, version="0.27.0")
    assert on["kept"] is True  # vLLM 0.27.0 itself
    assert on["probe"] == "fixed upstream (buffer restore waits for the weights tag)"
    assert on["decision"] == "stand down: fixed upstream in 0.27.0", proc.stderr


@pytest.mark.parametrize("version", ["0.27.2", "0.29.1"])
def test_real_gold_wakes_kv_cache_first(version, tmp_path):
    """TRL GOLD 0.25-0.29 wakes only ``kv_cache`` after each level-2 sleep; the shim's GOLD patch
    (``trl-gold-weights-asleep``) then wakes and pushes the weights. Without this patch the
    kv_cache wake itself faults in the buffer restore; with it, every rollout runs on the
    trainer's weights."""
    from tests.support.trl_support import run_trl

    with pytest.raises(AssertionError, match="_restore_saved_buffers"):
        run_trl(version, tmp_path / "off", "--trainer", "gold", "--shim", "before",
                env={"SHIM_DISABLED_PATCHES": "vllm-level2-buffers"})
    result = run_trl(version, tmp_path / "on", "--trainer", "gold", "--shim", "before")
    assert len(result["generates"]) == 6 and result["mismatches"] == 0 and result["lost_writes"] == 0


@pytest.mark.parametrize("device", ["cuda", "npu"])
def test_level2_wake_of_both_tags_in_one_call_restores_the_buffers(model_dir, device):
    """A wake that includes ``weights`` is left to upstream's restore, whatever other tag comes with it
    (the saved buffers are hidden only from a wake without ``weights``)."""
    on, proc = run(model_dir, BOTH_TAGS, shim=True, device=device)
    assert on["n_buffers"] >= 1 and on["kept"] is True and on["same_output"] is True, proc.stderr


@pytest.fixture(scope="module")
def mla_dir(tmp_path_factory):
    from tests.tiny import make_tiny_mla_model

    return make_tiny_mla_model(str(tmp_path_factory.mktemp("mla") / "m"), seed=0)


@pytest.mark.parametrize("version,device", [("0.10.2", "cuda"), ("0.24.0", "cuda"), ("0.24.0", "npu")])
def test_level2_wake_without_tags_restores_buffers_and_plain_tensors(mla_dir, version, device):
    """``wake_up()`` with no tags wakes every tag, the weights included: the saved buffers are left to
    upstream's restore (``vllm-level2-buffers`` must not hide them as from a ``kv_cache``-only wake) and the
    plain tensors a level-2 sleep discards are written back (``vllm-level2-tensors``). A tiny DeepSeek-V2 with
    a quantized ``kv_b_proj`` (rope buffers, and MLA's dequantized matrices as plain attributes), on vLLM's
    tag-blind restore (< 0.27; vllm-ascend in every release). Without the shim the buffers come back
    (upstream restores them) but the plain tensors do not (the bug ``vllm-level2-tensors`` fixes)."""
    env = dict(version=version, device=device, FAKEVLLM_QUANTIZATION="fp8")
    off, _ = run(mla_dir, CHILDREN / "no_tags.py", shim=False, **env)
    assert off["n_buffers"] >= 1 and off["n_mla"] >= 1
    assert off["kept"] is True and off["derived_back"] is False and off["same_output"] is False
    on, proc = run(mla_dir, CHILDREN / "no_tags.py", shim=True, **env)
    assert on["kept"] is True and on["derived_back"] is True and on["same_output"] is True, proc.stderr
