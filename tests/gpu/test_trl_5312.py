"""huggingface/trl#5312 on a real GPU, real vLLM and real TRL 1.9.2 / 1.10.0 GRPOTrainer.

Numbers from bench/gpu_trl_5312.py: 6 GRPO steps, lr 3e-3, tiny random Qwen2,
vLLM colocated with sleep mode; the engine's parameters compared with the
trainer's right before vLLM samples (tests/gpu/grpo_run.py).
"""
import pytest

from tests.gpu import common
from tests.gpu.results import load, run_of

pytestmark = pytest.mark.skipif(common.test_skip_reason() is not None, reason=common.test_skip_reason() or "")

LOGP = "sampling/sampling_logp_difference/mean"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load("gpu_trl_5312", tmp_path_factory)


def series(run):
    return [m[LOGP] for m in run["metrics"] if LOGP in m]


def test_shim_every_rollout_uses_the_trainers_weights(data):
    run = run_of(data, "1.9.2 sleep on + shim")
    assert run["decisions"]["trl-stale-weights"] == "applied"
    assert run["rollouts"] >= data["steps"]
    bad = [g for g in run["generates"] if not g["engine_eq_trainer"]]
    assert not bad, bad[:2]
    assert run["rollouts_on_checkpoint_after_training"] == 0
    assert run["reload_weights_calls"] == 0  # the disk (initial checkpoint) is never read


def test_without_the_shim_rollouts_use_the_initial_checkpoint(data):
    run = run_of(data, "1.9.2 sleep on")
    trained = [g for g in run["generates"] if g["step"] > 0]
    assert trained and all(g["engine_eq_checkpoint"] and not g["engine_eq_trainer"] for g in trained)
    assert run["reload_weights_calls"] == run["rollouts"]


def test_logp_difference_equals_the_upstream_fix(data):
    fixed = series(run_of(data, "1.9.2 sleep on + shim"))
    upstream = series(run_of(data, "1.10.0 sleep on"))
    assert len(fixed) == len(upstream) == data["steps"]
    assert fixed == upstream


def test_logp_difference_equals_sleep_off(data):
    fixed = series(run_of(data, "1.9.2 sleep on + shim"))
    off = series(run_of(data, "1.9.2 sleep off"))
    assert fixed == pytest.approx(off, rel=1e-3, abs=1e-6)


def test_bug_shows_in_trls_own_metric(data):
    bug = series(run_of(data, "1.9.2 sleep on"))
    fixed = series(run_of(data, "1.9.2 sleep on + shim"))
    # after the first update the engine samples from the initial weights: far from the trainer's
    assert len(bug) == len(fixed) >= 2
    assert min(bug[1:]) > 10 * max(fixed[1:])


def test_shim_stands_down_on_1_10_0_with_identical_numbers(data):
    shimmed = run_of(data, "1.10.0 sleep on + shim")
    assert shimmed["decisions"]["trl-stale-weights"].startswith("stand down")
    assert series(shimmed) == series(run_of(data, "1.10.0 sleep on"))
    assert shimmed["rollouts_on_trainer_weights"] == shimmed["rollouts"]
