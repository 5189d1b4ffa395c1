"""TRL: at every vLLM generate the engine's weights equal the trainer's (real TRL releases, CPU).

Each case runs a real TRL trainer (colocate, ``vllm_enable_sleep_mode=True``,
gradient_accumulation_steps=2 with one generation per micro-batch, so the
second generation of each step is one where TRL skips its sync) on the vLLM
stand-in, twice: shim off must show the release's bug (asserted), shim on must
hold the invariant. On releases without the bug the shim stands down and
upstream behaviour is unchanged (same weight pushes).
"""
import functools

import pytest

from tests.support.envs import TRL_VERSIONS
from tests.support.trl_support import run_trl

# What each release does without the shim (tests/../notes: the code paths, by version).
OK, GARBAGE, CHECKPOINT = "ok", "generates from discarded weights", "generates from the initial checkpoint"
GRPO_BUG = {
    "0.23.1": OK, "0.24.0": OK,  # level-1 sleep keeps a CPU copy
    "0.25.1": GARBAGE,  # level 2, sync skipped within a step
    "0.26.2": CHECKPOINT, "0.27.2": CHECKPOINT,  # reload_weights, sync skipped within a step
    "0.28.0": CHECKPOINT, "0.29.0": CHECKPOINT, "0.29.1": CHECKPOINT, "1.0.0": CHECKPOINT, "1.9.2": CHECKPOINT,  # #5312
    "1.10.0": OK, "1.16.0": OK,  # fixed upstream (#5313)
}
assert set(GRPO_BUG) == set(TRL_VERSIONS)


@functools.lru_cache(maxsize=None)
def run(version, trainer="grpo", shim="off", sleep="on", device="cuda", tmp=None):
    import tempfile

    out = tempfile.mkdtemp(prefix=f"trl-{version}-{trainer}-{shim}-")
    return run_trl(version, out, "--trainer", trainer, "--shim", shim, "--sleep", sleep,
                   env={"FAKEVLLM_DEVICE": device})


def assert_bug(result, bug):
    if bug == OK:
        assert result["mismatches"] == 0, result["generates"]
    elif bug == GARBAGE:
        assert result["mismatches"] > 0 and result["from_checkpoint_after_training"] == 0, result["generates"]
    else:
        assert result["from_checkpoint_after_training"] > 0, result["generates"]


def assert_invariant(result):
    assert len(result["generates"]) == 6
    assert result["mismatches"] == 0, result["generates"]
    assert result["lost_writes"] == 0
    assert result["reloads"] == 0


@pytest.mark.parametrize("version", TRL_VERSIONS)
def test_grpo_every_generate_uses_trained_weights(version):
    off = run(version)
    assert_bug(off, GRPO_BUG[version])
    on = run(version, shim="before")
    if GRPO_BUG[version] == OK:  # stand down: upstream behaviour unchanged
        assert on["mismatches"] == 0
        assert on["load_weights_events"] == off["load_weights_events"]
        assert on["reloads"] == off["reloads"]
        # the weight-sync fixes stand down (trl-vlm-encoder-cache, a separate bug, applies from 0.28 on)
        sync_fixes = ("trl-stale-weights", "trl-grpo-level2-resync", "trl-rloo-level2-resync")
        trl_decisions = {k: d for k, d in on["decisions"].items() if k in sync_fixes}
        assert not any(d == "applied" for d in trl_decisions.values()), trl_decisions
    else:
        assert_invariant(on)
        assert "applied" in on["decisions"].values()
    if version in ("1.10.0", "1.16.0"):
        assert on["decisions"]["trl-stale-weights"] == "stand down: fixed upstream in 1.10.0"


def test_0_28_push_into_unmapped_memory_is_fixed():
    """#5142: 0.28.0's sync_weights writes while the weights are asleep (lost on CUDA)."""
    assert run("0.28.0")["lost_writes"] > 0
    assert run("0.28.0", shim="before")["lost_writes"] == 0


def test_shim_pushes_as_often_as_the_upstream_fix():
    assert run("1.9.2", shim="before")["load_weights_events"] == run("1.10.0")["load_weights_events"]


@pytest.mark.parametrize("version", ["1.9.2", "0.26.2"])
def test_activation_after_trl_import(version):
    assert_invariant(run(version, shim="after"))


@pytest.mark.parametrize("version,bug", [("0.25.1", GARBAGE), ("0.27.2", CHECKPOINT), ("1.9.2", CHECKPOINT)])
def test_rloo(version, bug):
    assert_bug(run(version, "rloo"), bug)
    assert_invariant(run(version, "rloo", shim="before"))


@pytest.mark.parametrize("version", ["0.28.0", "1.9.2", "1.16.0"])
def test_online_dpo_gradient_accumulation(version):
    """Upstream generates per micro-batch but pushes only when global_step changes (level-2 sleep)."""
    assert_bug(run(version, "online_dpo"), GARBAGE)
    on = run(version, "online_dpo", shim="before")
    assert_invariant(on)
    assert on["decisions"]["trl-online-dpo-resync"] == "applied"


def _logp_diff(result):
    values = [m["sampling/sampling_logp_difference/mean"] for m in result["metrics"]
              if "sampling/sampling_logp_difference/mean" in m and m["step"] >= 2]
    assert values
    return sum(values) / len(values)


def test_end_to_end_logp_difference_1_9_2():
    """TRL's own metric: with the shim it matches the sleep-off run; without, the #5312 signature."""
    sleep_off = _logp_diff(run("1.9.2", sleep="off"))
    without = _logp_diff(run("1.9.2"))
    with_shim = _logp_diff(run("1.9.2", shim="before"))
    assert without >= 5 * sleep_off, (without, sleep_off)
    assert with_shim <= 1.5 * sleep_off, (with_shim, sleep_off)


def test_npu_1_9_2_no_reload_weights():
    """vllm-ascend < 0.24.0rc1: reload_weights raises NotImplementedError; TRL swallows it and the
    second generate of a step reads discarded weights. With the shim: trained weights, no error."""
    off = run("1.9.2", device="npu")
    assert off["reloads"] == 0 and off["mismatches"] > 0
    assert_invariant(run("1.9.2", shim="before", device="npu"))


def test_npu_0_28_push_into_sleeping_engine_crashes_without_shim():
    """#5142 on NPU: 0.28.0 writes weights into the unmapped pool -> MTE error. The shim wakes first."""
    with pytest.raises(AssertionError, match="The DDR address of the MTE instruction is out of range"):
        run("0.28.0", device="npu")
    assert_invariant(run("0.28.0", shim="before", device="npu"))


@pytest.mark.parametrize("version", ["0.27.2", "0.29.1"])
def test_gold_generates_with_weights_asleep_without_shim(version):
    """GOLD 0.25-0.29 wakes only kv_cache before generating: the first on-policy generate reads
    unmapped weights. With the shim the weights are woken and pushed first."""
    with pytest.raises(AssertionError, match="an illegal memory access was encountered"):
        run(version, "gold")
    assert_invariant(run(version, "gold", shim="before"))


@pytest.mark.parametrize("version", ["0.27.2", "1.0.0"])  # trainer.llm / trainer.vllm_generation.llm
def test_openenv_rollout_helper_without_shim(version, tmp_path):
    """TRL's own ``trl.experimental.openenv.utils.generate_rollout_completions`` (0.26-1.8), called from a GRPO
    ``rollout_func`` as the OpenEnv recipes do. It wakes only the KV cache and runs
    ``collective_rpc("reload_weights")``: right after the trainer's push that reloads the initial checkpoint from
    disk (0.27.2); on the second rollout of a step, where GRPO skips its sync, the weights are still asleep from the
    helper's own ``sleep(level=2)``, so the reload writes into unmapped memory and the generate faults (1.0.0, whose
    sync wakes the weights only when it runs). With the shim the synced engine never reloads from disk and pushes
    the trained weights whenever they are asleep: the trained weights at every generate."""
    args = ("--trainer", "grpo", "--rollout", "openenv")
    if version == "0.27.2":
        off = run_trl(version, tmp_path / "off", *args, "--shim", "off")
        assert off["reloads"] > 0 and off["from_checkpoint_after_training"] > 0, off["generates"]
    else:
        with pytest.raises(AssertionError, match="an illegal memory access was encountered"):
            run_trl(version, tmp_path / "off", *args, "--shim", "off")
    on = run_trl(version, tmp_path / "on", *args, "--shim", "before")
    assert_invariant(on)


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
    default = run(version, shim="before")
    assert default["decisions"]["trl-sleep-level"] == "stand down: SHIM_SLEEP_LEVEL is unset (TRL's own level)"
    assert default["sleep_levels"] and set(default["sleep_levels"]) == {2}
    assert default["weights_wakes_kept"] and not any(default["weights_wakes_kept"])  # level 2 discards them
    assert default["mismatches"] == 0
    if version == "1.9.2":
        assert level1["load_weights_events"] < default["load_weights_events"], (level1, default)
