"""TRL: a PEFT LoRA weight push leaves the frozen base's bytes alone (real TRL 1.16.0 + PEFT, CPU).

Every TRL push of a PEFT model merges the adapter into the base in place and unmerges it after
(``VLLMGeneration._iter_named_params``); in bfloat16 ``(W + dW) - dW != W``, so the frozen base
moves at every sync. Each case runs TRL's own code twice: shim off must show the base moving
(asserted), shim on must keep the base's bytes at every push while the engine holds the base plus
the adapter, within one bfloat16 rounding of a reference merged out of place
(``tests/support/lora_check.py``), for both LoRA layer classes in the model (``lora.Linear`` on
``q_proj``/``v_proj``, ``lora.Embedding`` on ``embed_tokens``).
"""
import functools
import tempfile

from tests.support.helpers import REPO
from tests.support.trl_support import run_trl

SERVER = REPO / "tests" / "scenarios" / "trl_lora_server.py"
LORA_CLASSES = {"Linear", "Embedding"}


@functools.lru_cache(maxsize=None)
def colocate(shim):
    out = tempfile.mkdtemp(prefix=f"trl-lora-colocate-{shim}-")
    return run_trl("1.16.0", out, "--trainer", "grpo", "--shim", shim, "--lora", "--steps", "4")


@functools.lru_cache(maxsize=None)
def server(shim, *extra):
    out = tempfile.mkdtemp(prefix=f"trl-lora-server-{shim}-")
    return run_trl("1.16.0", out, "--shim", shim, "--syncs", "4", *extra, script=SERVER)


def assert_adapter_visible(effect):
    """The comparison is not vacuous: the adapter moves many elements of each LoRA layer class
    by more than one rounding, so a push without it (or with half of it) is caught."""
    assert set(effect) == LORA_CLASSES and min(effect.values()) > 100, effect


def test_colocate_grpo_lora_push_keeps_the_frozen_base():
    off = colocate("off")
    moved = [g["base_changed"] for g in off["generates"]]
    assert moved[-1] > 0, moved  # the bug: merge/unmerge in place moved the frozen base
    assert moved[-1] > min(m for m in moved if m > 0), moved  # ... and it keeps walking with the pushes

    on = colocate("before")
    assert on["decisions"]["trl-lora-merge-drift"] == "applied"
    assert len(on["generates"]) == len(off["generates"]) == 8
    for g in on["generates"]:
        assert g["base_changed"] == 0, on["generates"]  # base bytes unchanged at every generate
        assert g["beyond"] == 0, on["generates"]  # engine = base + adapter (within one rounding)
    assert_adapter_visible(on["generates"][-1]["effect"])
    assert on["load_weights_events"] == off["load_weights_events"]  # same pushes as upstream
    assert on["shim_warnings"] == []


def test_server_mode_lora_push_keeps_the_frozen_base():
    off = server("off")
    assert off["syncs"][0]["base_changed"] > 0, off["syncs"]  # the first sync already moves the base

    on = server("before")
    assert on["decisions"]["trl-lora-merge-drift"] == "applied"
    assert on["updates"] == on["resets"] == 4 and on["received"] == off["received"]
    for sync in on["syncs"]:
        assert sync["base_changed"] == 0 and sync["beyond"] == 0, on["syncs"]
        assert_adapter_visible(sync["effect"])


def test_lora_variant_is_left_to_upstream():
    """DoRA (a LoRA variant the out-of-place path does not reproduce): upstream's in-place merge
    runs unchanged (the base moves as without the shim), and one WARNING says so."""
    off, on = server("off", "--dora"), server("before", "--dora")
    assert off["syncs"][0]["base_changed"] > 0
    assert [s["base_changed"] for s in on["syncs"]] == [s["base_changed"] for s in off["syncs"]]
    lines = [w for w in on["shim_warnings"] if w.startswith("trl-lora-merge-drift")]
    assert len(lines) == 1 and "LoRA variants" in lines[0], on["shim_warnings"]
