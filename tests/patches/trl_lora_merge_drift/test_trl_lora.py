"""TRL: a PEFT LoRA weight push leaves the frozen base's bytes alone (real TRL releases + PEFT 0.18.1, CPU).

Every TRL push of a PEFT model merges the adapter into the base in place and unmerges it after
(1.11-1.16 ``VLLMGeneration._iter_named_params``, 0.28-1.10 ``VLLMGeneration.sync_weights``,
0.23-0.27 ``GRPOTrainer``/``RLOOTrainer._move_model_to_vllm``: one record each); in bfloat16
``(W + dW) - dW != W``, so the frozen base moves at every sync. Each case runs TRL's own code twice: shim off must show the base moving
(asserted), shim on must keep the base's bytes at every push while the engine holds the base plus
the adapter, within one bfloat16 rounding of a reference merged out of place
(``tests/support/lora_check.py``), for both LoRA layer classes in the model (``lora.Linear`` on
``q_proj``/``v_proj``, ``lora.Embedding`` on ``embed_tokens``).
"""
import functools
import tempfile

import pytest

from tests.support.helpers import REPO
from tests.support.trl_support import run_trl

SERVER = REPO / "tests" / "scenarios" / "trl_lora_server.py"
LORA_CLASSES = {"Linear", "Embedding"}


# release -> the record that covers its push (the shape it pushes through)
RECORD = {"1.16.0": "trl-lora-merge-drift", "1.9.2": "trl-lora-merge-drift-sync", "1.0.0": "trl-lora-merge-drift-sync",
          "0.27.2": "trl-lora-merge-drift-grpo"}


@functools.lru_cache(maxsize=None)
def colocate(version, shim, trainer="grpo"):
    out = tempfile.mkdtemp(prefix=f"trl-lora-colocate-{version}-{trainer}-{shim}-")
    return run_trl(version, out, "--trainer", trainer, "--shim", shim, "--lora", "--steps", "4")


@functools.lru_cache(maxsize=None)
def server(version, shim, *extra):
    out = tempfile.mkdtemp(prefix=f"trl-lora-server-{version}-{shim}-")
    return run_trl(version, out, "--shim", shim, "--syncs", "4", *extra, script=SERVER)


def assert_adapter_visible(effect):
    """The comparison is not vacuous: the adapter moves many elements of each LoRA layer class
    by more than one rounding, so a push without it (or with half of it) is caught."""
    assert set(effect) == LORA_CLASSES and min(effect.values()) > 100, effect


@pytest.mark.parametrize("version,trainer", [("1.16.0", "grpo"), ("1.9.2", "grpo"), ("1.0.0", "grpo"),
                                             ("0.27.2", "grpo"), ("0.27.2", "rloo")])
def test_colocate_lora_push_keeps_the_frozen_base(version, trainer):
    off = colocate(version, "off", trainer)
    moved = [g["base_changed"] for g in off["generates"]]
    assert moved[0] > 0, moved  # the bug: merge/unmerge in place moved the frozen base at the first push
    assert moved[-1] > moved[0], moved  # ... and it keeps walking with the pushes

    on = colocate(version, "before", trainer)
    record = RECORD[version].replace("-grpo", f"-{trainer}")
    assert on["decisions"][record] == "applied"
    assert len(on["generates"]) == len(off["generates"]) == 8
    for g in on["generates"]:
        assert g["base_changed"] == 0, on["generates"]  # base bytes unchanged at every generate
        assert g["beyond"] == 0, on["generates"]  # engine = base + adapter (within one rounding)
    assert_adapter_visible(on["generates"][-1]["effect"])
    if version == "1.16.0":  # no other fix acts on this release's pushes: the same ones as upstream
        assert on["load_weights_events"] == off["load_weights_events"]
    assert not [w for w in on["shim_warnings"] if "lora-merge-drift" in w], on["shim_warnings"]


@pytest.mark.parametrize("version", ["1.16.0", "1.9.2", "0.27.2"])
def test_server_mode_lora_push_keeps_the_frozen_base(version):
    off = server(version, "off")
    assert off["syncs"][0]["base_changed"] > 0, off["syncs"]  # the first sync already moves the base

    on = server(version, "before")
    assert on["decisions"][RECORD[version]] == "applied"
    assert on["resets"] == 4 and on["received"] == off["received"] > 0
    assert on["left_behind"] == off["left_behind"], on["left_behind"]  # every stand-in taken out again
    for sync in on["syncs"]:
        assert sync["base_changed"] == 0 and sync["beyond"] == 0, on["syncs"]
        assert_adapter_visible(sync["effect"])


def test_lora_variant_is_left_to_upstream():
    """DoRA (a LoRA variant the out-of-place path does not reproduce): upstream's in-place merge
    runs unchanged (the base moves as without the shim), and one WARNING says so."""
    off, on = server("1.16.0", "off", "--dora"), server("1.16.0", "before", "--dora")
    assert off["syncs"][0]["base_changed"] > 0
    assert [s["base_changed"] for s in on["syncs"]] == [s["base_changed"] for s in off["syncs"]]
    lines = [w for w in on["shim_warnings"] if w.startswith("trl-lora-merge-drift")]
    assert len(lines) == 1 and "LoRA variants" in lines[0], on["shim_warnings"]


@pytest.mark.parametrize("version", ["1.16.0"])
def test_colocate_lora_bias_pushed_merged(version):
    """``LoraConfig(lora_bias=True)``: PEFT's merge also adds ``lora_B.bias * scaling`` to the base bias (and its
    unmerge subtracts it, moving the bias by a rounding too). The engine must get the merged bias, the base bias
    must keep its bytes. Without the shim the base biases walk; a push of the bias un-merged is caught by
    ``beyond`` (the reference includes the LoRA bias)."""
    off = colocate_bias(version, "off")
    assert off["generates"][-1]["bias_changed"] > 0, off["generates"]  # the bug reaches the biases too
    on = colocate_bias(version, "before")
    assert on["decisions"][RECORD[version]] == "applied"
    assert len(on["generates"]) == len(off["generates"]) == 8
    for g in on["generates"]:
        assert g["bias_changed"] == 0 and g["base_changed"] == 0, on["generates"]
        assert g["beyond"] == 0, on["generates"]  # engine = base + adapter, bias included (within one rounding)
        assert g["bias_effect"] > 10, on["generates"]  # the LoRA bias moves the biases: not vacuous


def colocate_bias(version, shim):
    out = tempfile.mkdtemp(prefix=f"trl-lora-bias-{version}-{shim}-")
    return run_trl(version, out, "--trainer", "grpo", "--shim", shim, "--lora", "--lora-bias", "--steps", "4")
