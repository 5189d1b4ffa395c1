"""SHIM_SLEEP_LEVEL (feature ``trl-sleep-level``, ``shim.trl.sleep_level``) on the real TRL releases and
next to ms-swift's own ``--sleep_level``, on the vLLM stand-in (level 1 offloads the weights to host memory
and restores them at the wake; level 2 discards them)."""
import pytest

from tests.support.swift_support import run_swift
from tests.support.trl_support import run_trl


@pytest.mark.parametrize("version", ["1.16.0", "1.9.2"])
def test_sleep_level_switch_keeps_the_weights_across_sleeps(version, tmp_path):
    """SHIM_SLEEP_LEVEL=1 (feature ``trl-sleep-level``): every sleep of VLLMGeneration's engine, the one
    right after construction included, runs at level 1 and every weights wake brings back the weights the
    engine slept with (no push needed to make them valid); the rollouts still use the trainer's weights.
    Unset: TRL's own level 2, every woken weight discarded. 1.9.2 runs with the stale-weights fix, whose
    push-before-generate is then needed only after a sync: fewer pushes than at level 2."""
    level1 = run_trl(version, tmp_path / "level1", "--trainer", "grpo", "--shim", "before", "--sleep", "on",
                     env={"SHIM_SLEEP_LEVEL": "1"})
    assert level1["decisions"]["trl-sleep-level"] == "applied"
    assert level1["sleep_levels"] and set(level1["sleep_levels"]) == {1}, level1["sleep_levels"]
    assert level1["weights_wakes_kept"] and all(level1["weights_wakes_kept"]), level1["weights_wakes_kept"]
    assert level1["mismatches"] == 0 and level1["lost_writes"] == 0
    assert any("sleeps at level 1 instead of 2 (SHIM_SLEEP_LEVEL=1)" in m for _, m in level1["shim_log"])
    default = run_trl(version, tmp_path / "default", "--trainer", "grpo", "--shim", "before", "--sleep", "on")
    assert default["decisions"]["trl-sleep-level"] == "stand down: SHIM_SLEEP_LEVEL is unset (TRL's own level)"
    assert default["sleep_levels"] and set(default["sleep_levels"]) == {2}
    assert default["weights_wakes_kept"] and not any(default["weights_wakes_kept"])  # level 2 discards them
    assert default["mismatches"] == 0
    if version == "1.9.2":
        assert level1["load_weights_events"] < default["load_weights_events"], (level1, default)


def test_sleep_level_switch_leaves_swift_sleep_level_alone():
    """SHIM_SLEEP_LEVEL is for TRL's VLLMGeneration engine only: ms-swift's own engine keeps the user's
    ``--sleep_level`` (4.6.0's GRPO module imports TRL 0.29.1's GRPOTrainer and VLLMGeneration module, where the
    feature applies)."""
    on = run_swift("4.6.0", "--level", "2", "--shim", "--grpo-module", env={"SHIM_SLEEP_LEVEL": "1"})
    assert on["decisions"]["trl-sleep-level"] == "applied"
    assert on["sleep_levels"] and set(on["sleep_levels"]) == {2}, on["sleep_levels"]
    assert on["mismatches"] == 0 and len(on["generates"]) == 4
