"""ms-swift 4.6.0 GRPO through its CLI on a real GPU, with and without ``python -m shim`` (issue 13, run 1).

Numbers from bench/gpu_swift.py (tests/gpu/run_swift.sh): ``NPROC_PER_NODE=1``, colocated vLLM,
``--sleep_level`` 1 and 2, full and LoRA (``--vllm_enable_lora true``), tiny random Qwen2, the user's
``PYTORCH_CUDA_ALLOC_CONF`` set; observation by tests/gpu/swift_plugin.py. Results are read from
``$SHIM_GPU_RESULTS/gpu_swift_grpo*.json`` (one file per call of run_swift.sh, merged here); without
that variable these tests are skipped (the runs need the ms-swift wheels and the bundle:
tests/gpu/run_swift.sh). A record made by ``--cpu-dry-run`` (tests/fakevllm) is checked too, except for
what only real CUDA shows (ms-swift rewrites the allocator string only when CUDA is available; timing).
"""
import glob
import os

import pytest

from tests.gpu import common, results

FOLDER = os.environ.get(common.RESULTS_ENV)
pytestmark = pytest.mark.skipif(not FOLDER, reason=f"{common.RESULTS_ENV} is not set (tests/gpu/run_swift.sh sets it)")
# s/step with the shim over without it, median of steps 2..N; tiny model, so mostly sleep/wake and noise
MAX_RATIO = float(os.environ.get("SHIM_GPU_MAX_SWIFT_STEP_RATIO", "1.25"))
CONFIGS = [(t, lvl) for t in ("full", "lora") for lvl in (1, 2)]


@pytest.fixture(scope="module")
def data():
    files = sorted(glob.glob(os.path.join(FOLDER or "", "gpu_swift_grpo*.json")))
    if not files:
        pytest.skip(f"no {FOLDER}/gpu_swift_grpo*.json")
    merged = {"runs": {}}
    for f in files:
        d = common.read_json(f) or {}
        runs = d.pop("runs", {})
        merged.update({k: v for k, v in d.items() if k not in merged or k == "env"})
        merged["runs"].update(runs)
    return merged


def run_of(data, tuner, level, shim):
    label = f"grpo {tuner} L{level}" + (" + shim" if shim else "")
    r = results.run_of(data, label)  # skips a run that was not made or was skipped
    assert r.get("rc") == 0 and r.get("metrics"), f"run {label!r} failed: {r.get('error')}"
    return r


def rewards(run):
    return [m["reward"] for m in run["metrics"] if "reward" in m]


def dry(data):
    return bool(data.get("cpu_dry_run"))


@pytest.mark.parametrize("shim", [False, True], ids=["off", "shim"])
@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_runs_to_the_end_and_every_rollout_uses_the_trainers_weights(data, tuner, level, shim):
    run = run_of(data, tuner, level, shim)
    assert len(rewards(run)) == data["steps"]
    gens = run["rollouts"]
    assert len(gens) >= data["steps"], gens
    assert not [g for g in gens if g.get("error")], gens[:2]
    if tuner == "full":
        bad = [g for g in gens if not g["engine_eq_trainer"]]
        assert not bad, bad[:2]  # every parameter, bit for bit
        # the comparison can fail: training moved the weights away from the checkpoint
        assert any(not g["engine_eq_checkpoint"] for g in gens if g["step"] > 0)
    else:
        # LoRA: the trainer's frozen base drifts by bf16 rounding (ms-swift merges and unmerges the adapter into
        # it at every adapter push; upstream, with and without the shim, see test_lora_base_drift_is_upstreams);
        # the engine's base must be that base up to the drift, not discarded memory (level 2) or garbage
        bad = [g for g in gens if g["max_abs_diff_trainer"] > max(4 * g.get("trainer_base_drift", 0.0), 1e-6)
               or g["unmatched"]]
        assert not bad, bad[:2]
        loras = [g["lora"] for g in gens if g["step"] > 0]
        assert loras and all(x.get("pushed_eq_trainer") for x in loras), loras[:2]
        if not dry(data):
            assert all(x.get("engine_eq_trainer") for x in loras), loras[:2]
        sums = [x["trainer_lora_A_checksum"] for x in loras]
        if not dry(data):  # the comparison can fail: the adapter trains (lora_A moves once lora_B is non-zero)
            assert len(sums) >= 2 and sums[0] != sums[-1], sums


@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_rewards_identical_with_and_without_the_shim(data, tuner, level):
    """ms-swift 4.6.0 is correct upstream here: the shim must not change what is trained."""
    off, on = rewards(run_of(data, tuner, level, False)), rewards(run_of(data, tuner, level, True))
    assert on == pytest.approx(off, abs=1e-6)


@pytest.mark.parametrize("level", [1, 2])
def test_lora_base_drift_is_upstreams(data, level):
    """ms-swift 4.6.0's adapter push (``_move_adapter_to_vllm``: ``merge_adapter()``, read the adapter,
    ``unmerge_adapter()``) changes the trainer's frozen bf16 base a little at every push; the shim does not
    touch that path: the drift is the same, rollout for rollout, with and without it."""
    off, on = run_of(data, "lora", level, False), run_of(data, "lora", level, True)
    drift = lambda run: [g.get("trainer_base_drift") for g in run["rollouts"]]  # noqa: E731
    assert drift(on) == drift(off)


@pytest.mark.parametrize("shim", [False, True], ids=["off", "shim"])
@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_every_sleep_frees_the_pool(data, tuner, level, shim):
    run = run_of(data, tuner, level, shim)
    sleeps = [s for s in run["sleep_wake"] if s["op"] == "sleep"]
    assert len(sleeps) >= data["steps"]
    assert all(s["level"] == level for s in sleeps)
    low = [s for s in sleeps if (s.get("freed_share") or 0) < 0.95]
    assert not low, low[:2]


@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_shim_trace_agrees_and_report_runs(data, tuner, level):
    run = run_of(data, tuner, level, True)
    trace = run["trace"]
    sleeps = [s for s in trace["sleeps"] if s.get("effective") is not None]
    assert len(sleeps) == len([s for s in run["sleep_wake"] if s["op"] == "sleep"])
    assert all(s["effective"] and s["share"] >= 0.95 for s in sleeps), sleeps[:2]
    assert run["report"]["rc"] == 0 and "GiB freed/sleep" in run["report"]["stdout"], run["report"]


@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_shim_reaches_launcher_torchrun_and_rank(data, tuner, level):
    acts = run_of(data, tuner, level, True)["trace"]["activations"]
    ranks = [a for a in acts if a["rank"] == 0 and a["argv"] and a["argv"][0].endswith("cli/rlhf.py")]
    assert len(ranks) == 1 and len(acts) >= 3, acts  # swift.cli.main -> torch.distributed.run -> rank 0


@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_users_allocator_string_kept_with_the_shim(data, tuner, level):
    on = run_of(data, tuner, level, True)
    user = on["user_alloc"]["PYTORCH_CUDA_ALLOC_CONF"]
    assert user == data["user_alloc_conf"]
    assert on["decisions"].get("swift-expandable-segments-4x") == "applied", on["decisions"]
    assert on["alloc_at_step"] and all(s["PYTORCH_CUDA_ALLOC_CONF"] == user for s in on["alloc_at_step"])
    assert on["alloc_at_end"]["PYTORCH_CUDA_ALLOC_CONF"] == user
    if dry(data):
        pytest.skip("CPU dry run: ms-swift's set_expandable_segments acts only when CUDA is available")
    off = run_of(data, tuner, level, False)
    # without the shim ms-swift rewrites the whole string after building the engine (#6636's helper)
    assert any(s["PYTORCH_CUDA_ALLOC_CONF"] != user for s in off["alloc_at_step"]), off["alloc_at_step"]


@pytest.mark.parametrize("tuner,level", CONFIGS)
def test_step_time_with_and_without_the_shim(data, tuner, level):
    if dry(data):
        pytest.skip("CPU dry run: no timing")
    off = run_of(data, tuner, level, False)["step_s_median_after_first"]
    on = run_of(data, tuner, level, True)["step_s_median_after_first"]
    assert on / off <= MAX_RATIO, (on, off)
