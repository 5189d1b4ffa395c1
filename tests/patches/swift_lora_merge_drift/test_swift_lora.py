"""ms-swift: a LoRA weight push leaves the frozen base's bytes alone (real ms-swift 4.6.0 / 3.10.1, CPU).

ms-swift merges the adapter into the base in place and unmerges it after, around the full push
(``_move_full_model_to_vllm``, vLLM's LoRA off) and around the adapter push
(``_move_adapter_to_vllm``, vLLM's LoRA on); in bfloat16 ``(W + dW) - dW != W``. Each case drives
the real ``RolloutTrainerMixin`` (``tests/scenarios/swift_run.py --lora-merge``) twice: shim off
must show the base moving (asserted), shim on must keep its bytes at every rollout, and with the
adapter merged into the full push the engine must hold base plus adapter within one bfloat16
rounding of a reference merged out of place, for both LoRA layer classes in the model.
"""
import functools

import pytest

from tests.support.swift_support import run_swift

RECORD = {"4.6.0": "swift-lora-merge-drift", "3.10.1": "swift-lora-merge-drift-3x"}


@functools.lru_cache(maxsize=None)
def run(version, *args):
    return run_swift(version, "--lora-merge", "--steps", "3", *args)


@pytest.mark.parametrize("version", ["4.6.0", "3.10.1"])
def test_full_push_with_the_adapter_merged_keeps_the_frozen_base(version):
    off = run(version)
    moved = [g["base_changed"] for g in off["generates"]]
    assert moved[0] > 0 and moved[-1] > moved[0], moved  # the bug, walking with the pushes

    on = run(version, "--shim")
    assert on["decisions"][RECORD[version]] == "applied"
    assert len(on["generates"]) == len(off["generates"]) == 6
    if version == "4.6.0":  # 3.10.1: swift-level2-resync adds the pushes its level-2 gap skips
        assert on["pushes"] == off["pushes"]
    for g in on["generates"]:
        assert g["base_changed"] == 0 and g["beyond"] == 0, on["generates"]
    effect = on["generates"][-1]["effect"]  # not vacuous: the adapter moves many elements of each class
    assert set(effect) == {"Linear", "Embedding"} and min(effect.values()) > 100, effect


def test_adapter_push_with_vllm_lora_keeps_the_frozen_base():
    """vLLM's LoRA on, level 1: the base is pushed once, then the adapter alone, around which ms-swift
    4.6.0 still merges and unmerges."""
    off = run("4.6.0", "--vllm-lora", "--level", "1")
    moved = [g["base_changed"] for g in off["generates"]]
    assert moved[-1] > moved[0] > 0, moved

    on = run("4.6.0", "--vllm-lora", "--level", "1", "--shim")
    assert on["decisions"]["swift-lora-merge-drift"] == "applied"
    assert on["pushes"] == off["pushes"]
    assert [g["base_changed"] for g in on["generates"]] == [0] * len(off["generates"]), on["generates"]
