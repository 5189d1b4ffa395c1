"""ms-swift 4.6.0 on-policy GKD through its CLI on one GPU (issue 13, run 2).

Student ``--deepspeed zero2``, a small teacher ``--teacher_deepspeed zero3`` (tiny random Qwen2, other
weights), vLLM colocated at sleep level 1, ``NPROC_PER_NODE=1``; through ``python -m shim`` and once
without it. Results from ``$SHIM_GPU_RESULTS/gpu_swift_gkd.json`` (tests/gpu/run_swift.sh); skipped
without that variable. ZeRO-3 partitioning itself across ranks is measured in the two-GPU issue.
"""
import os

import pytest

from tests.gpu import common, results

FOLDER = os.environ.get(common.RESULTS_ENV)
pytestmark = pytest.mark.skipif(not FOLDER, reason=f"{common.RESULTS_ENV} is not set (tests/gpu/run_swift.sh sets it)")
LABEL = "gkd zero2 student, zero3 teacher"


@pytest.fixture(scope="module")
def data():
    d = common.read_json(os.path.join(FOLDER or "", "gpu_swift_gkd.json"))
    if d is None:
        pytest.skip(f"no {FOLDER}/gpu_swift_gkd.json")
    return d


def run_of(data, shim):
    label = LABEL + (" + shim" if shim else "")
    r = results.run_of(data, label)  # skips a run that was not made or was skipped
    assert r.get("rc") == 0 and r.get("metrics"), f"run {label!r} failed: {r.get('error')}"
    return r


def teacher_loads(data, run):
    return [x for x in run["from_pretrained"] if x["path"].rstrip("/") == data["teacher"].rstrip("/")]


def test_runs_to_the_end_through_the_shim(data):
    run = run_of(data, True)
    assert len(run["step_s"]) == data["gkd_steps"]
    assert run["decisions"].get("swift-gkd-teacher-zero3-4x") == "applied", run["decisions"]


def test_teacher_loads_partitioned_and_student_config_restored(data):
    run = run_of(data, True)
    loads = teacher_loads(data, run)
    assert loads and all(x["zero3"] for x in loads), run["from_pretrained"]
    student = [x for x in run["from_pretrained"] if x not in loads]
    assert student and not any(x["zero3"] for x in student), run["from_pretrained"]
    assert run["zero3_at_train_begin"] is False  # the student's ZeRO-2 config is back for training


def test_student_rollouts_use_the_trainers_weights(data):
    gens = run_of(data, True)["rollouts"]
    assert gens and all(g["engine_eq_trainer"] for g in gens), gens[:2]


def test_without_the_shim_the_teacher_loads_whole(data):
    """#6639's shape: under a ZeRO-2 student transformers does not see ZeRO-3 while the teacher loads."""
    loads = teacher_loads(data, run_of(data, False))
    assert loads and not any(x["zero3"] for x in loads)
