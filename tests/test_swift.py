"""ms-swift colocate rollouts on the vLLM stand-in, with the real RolloutTrainerMixin of each release.

Two training steps of two rollouts each (GKD per micro-batch, GRPO dynamic
sampling); the trainer's weights change between steps. Shim off must show the
release's bug (asserted), shim on must hold: at every generate the engine's
weights equal the trainer's.
"""
import pytest

from tests.swift_support import run_swift

SWIFT_VERSIONS = ("3.10.0", "3.10.1", "4.6.0")
LEVEL2_BUG = {"3.10.0": True, "3.10.1": True, "4.6.0": False}  # 4.x pushes after every level-2 sleep


@pytest.mark.parametrize("version", SWIFT_VERSIONS)
def test_level2_rollouts_use_trained_weights(version):
    off = run_swift(version, "--level", "2")
    if LEVEL2_BUG[version]:
        assert off["garbage"] > 0 and off["mismatches"] > 0, off["generates"]
    else:
        assert off["mismatches"] == 0, off["generates"]
    on = run_swift(version, "--level", "2", "--shim")
    assert len(on["generates"]) == 4
    assert on["mismatches"] == 0, on["generates"]
    expected = "applied" if LEVEL2_BUG[version] else "waiting: swift.trainers.rlhf_trainer.rollout_mixin not imported"
    assert on["decisions"]["swift-level2-resync"] == expected


@pytest.mark.parametrize("version", ["3.10.1", "4.6.0"])
def test_level1_unchanged(version):
    """Level 1 keeps a CPU copy: correct upstream; the shim changes nothing there."""
    off = run_swift(version, "--level", "1")
    on = run_swift(version, "--level", "1", "--shim")
    assert off["mismatches"] == 0 and on["mismatches"] == 0
    assert [g["origin"] for g in on["generates"]] == [g["origin"] for g in off["generates"]]
