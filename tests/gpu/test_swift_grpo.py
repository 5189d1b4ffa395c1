"""ms-swift 4.6.0 GRPO through its CLI on a real GPU, with and without ``python -m shim`` (issue 13, run 1).

Numbers from bench/gpu_swift.py (tests/gpu/run_swift.sh): ``NPROC_PER_NODE=1``, colocated vLLM,
``--sleep_level`` 1 and 2, full and LoRA (``--vllm_enable_lora true``), tiny random Qwen2, the user's
``PYTORCH_CUDA_ALLOC_CONF`` set; observation by tests/gpu/swift_plugin.py. Results are read from
``$SHIM_GPU_RESULTS/gpu_swift_grpo*.json`` (one file per call of run_swift.sh, merged here); without
that variable these tests are skipped (the runs need the ms-swift wheels and the bundle:
tests/gpu/run_swift.sh). A record made by ``--cpu-dry-run`` (tests/fakevllm) is checked too, except for
what only real CUDA shows (ms-swift rewrites the allocator string only when CUDA is available; timing).

LoRA and ``swift-lora-merge-drift`` (the fix of ms-swift's lossy in-place merge/unmerge around every
adapter push): with the shim the trainer's frozen base keeps its bytes, so from the second step on the
LoRA runs with and without the shim train different models. The LoRA assertions on the shim's runs
need a record made with that fix (its decision among the run's ``decisions``); an older record (the
committed H200 one, shim d96b4dc, predates it) skips them with that reason.
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


FIX = "swift-lora-merge-drift"


def lora_fix(data, level):
    """The LoRA shim run of ``level``, skipping when its record predates ``swift-lora-merge-drift``."""
    on = run_of(data, "lora", level, True)
    decision = (on.get("decisions") or {}).get(FIX)
    if decision is None:
        env = on.get("env") or data.get("env") or {}
        pytest.skip(f"the LoRA record predates {FIX} (shim {env.get('shim_commit')}, {env.get('date')}): "
                    f"its decisions lack it; needs a new GPU run (PHASES=grpo TUNERS=lora bash tests/gpu/run_swift.sh)")
    assert decision == "applied", decision
    return on


def drift(run):
    return [g.get("trainer_base_drift") for g in run["rollouts"]]


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
        # LoRA: without the shim the trainer's frozen base drifts by bf16 rounding (ms-swift merges and unmerges
        # the adapter into it at every adapter push; with the shim it stays, see
        # test_lora_base_kept_with_the_shim_drifts_without); the engine's base must be that base up to the
        # drift, not discarded memory (level 2) or garbage
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
    """Full tuning: ms-swift 4.6.0 is correct upstream here, the shim must not change what is trained.
    LoRA: identical up to step 1 only (its rollouts come before any trained adapter is pushed, the base
    is still the checkpoint in both runs); from step 2 on the runs train different bases (upstream's
    drifted one, the shim's kept one), so the rewards may differ and are not compared."""
    off, on = rewards(run_of(data, tuner, level, False)), rewards(run_of(data, tuner, level, True))
    if tuner == "full":
        assert on == pytest.approx(off, abs=1e-6)
        return
    lora_fix(data, level)
    assert len(on) == len(off) == data["steps"]
    assert on[:1] == pytest.approx(off[:1], abs=1e-6)


@pytest.mark.parametrize("level", [1, 2])
def test_lora_base_kept_with_the_shim_drifts_without(data, level):
    """ms-swift 4.6.0's adapter push (``_move_adapter_to_vllm``: ``merge_adapter()``, read the adapter,
    ``unmerge_adapter()``) changes the trainer's frozen bf16 base a little at every push: without the shim
    the base drifts (> 0 from the first push of a trained adapter); with it (``swift-lora-merge-drift``:
    the merge and unmerge write nothing during the push) the base stays bit-identical, drift 0 at every
    rollout."""
    off = run_of(data, "lora", level, False)
    assert drift(off)[0] == 0.0 and max(drift(off)) > 0, drift(off)
    on = lora_fix(data, level)
    assert drift(on) == [0.0] * len(on["rollouts"]), drift(on)


@pytest.mark.parametrize("level", [1, 2])
def test_lora_engine_holds_upstreams_merge_of_the_original_base(data, level):
    """What the engine computes with is upstream's merge of the original base: with vLLM's LoRA on
    (``--vllm_enable_lora true``) ms-swift pushes the base unmerged (at the start, and in full after each
    level-2 sleep) and the adapter separately, and vLLM merges them at run time; with the shim the base it
    holds is the checkpoint's, bit for bit, at every rollout (the trainer's too), and the adapter the
    trainer's. Without it a level-2 run re-pushes the drifted base (the engine leaves the checkpoint)."""
    off = run_of(data, "lora", level, False)
    if level == 2 and not dry(data):
        assert any(not g["engine_eq_checkpoint"] for g in off["rollouts"] if g["step"] > 0), off["rollouts"][:3]
    on = lora_fix(data, level)
    gens = on["rollouts"]
    bad = [g for g in gens if not (g["engine_eq_checkpoint"] and g["engine_eq_trainer"])]
    assert not bad, bad[:2]
    assert all(g["lora"].get("pushed_eq_trainer") for g in gens if g["step"] > 0), [g["lora"] for g in gens][:2]


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
