"""``verify-weights-verl`` / ``-verl-server`` / ``-vllm-worker`` with verl 0.9.1's ``vLLMHttpServer`` as a REAL Ray
actor (issue 30 item 1).

On an H200 (verl 0.9.1, Ray 2.60, under ``python -m shim``) every update was "unverifiable: the rollout server returned
no digests" although the actor logged ``verify-weights-verl-server ... applied``, and a tensor dropped in the worker
went unreported. Cause: ``ray.remote(vLLMHttpServer)`` (verl 0.9.1 ``vllm_async_server.py`` ``vLLMReplica.__init__``)
closes Ray's tracing wrapper over each method read off the class in the driver and ships the class to the actor by
value with cloudpickle, which took the shim's wrapt proxy for the function it proxies and copied that function's
code: the actor ran a bare copy of verl's ``collective_rpc`` (which returns nothing). Fixed in
``shim.engine.patcher`` (a wrapper on a method pickles by name). ``children/verl_ray_update.py`` starts a local Ray
cluster (loopback, one CPU, its own temp dir, ports Ray picks) under ``python -m shim``, as the GPU run did.
"""
import json
import shutil
import sys
import tempfile

import pytest

from tests.support.helpers import REPO, clean_env, last_json, run_python
from tests.support.verl_support import verl_environment

pytestmark = pytest.mark.xdist_group("ray")  # one local Ray cluster at a time (2 shared cores)

CHILD = REPO / "tests" / "patches" / "verify_weights" / "children" / "verl_ray_update.py"
DROP = "model.layers.0.mlp.down_proj.weight"
NO_DIGESTS = "returned no digests"


def run_on_ray(release: str, phases: list) -> tuple:
    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release)
    short = tempfile.mkdtemp(prefix="shim-verl-ray-", dir="/tmp")  # unix socket paths stay short
    try:
        env = clean_env(**extra, TEST_MODEL=tiny_model(), TEST_VERL_DROP=f"{short}/drop",
                        TEST_VERL_ZMQ=f"ipc://{short}/weights.sock", SHIM_VERIFY_WEIGHTS="1",
                        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                        HF_HUB_OFFLINE="1")
        env.pop("RAY_ADDRESS", None)
        proc = run_python(CHILD.read_text(), path=path, env=env, args=["-m", "shim", sys.executable],
                          argv=[json.dumps(phases)], timeout=420, fresh=True)
        return last_json(proc), proc.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_verl_0_9_1_on_a_real_ray_actor_every_update_is_verified_and_a_dropped_tensor_reported():
    """The shim applied in the actor and in its engine's worker (as the H200 logs said); verl's own update through
    the Ray actor: a clean update verified (no "returned no digests"), a tensor the worker leaves out reported as
    stale weights naming it, ``SHIM_STRICT=1`` raising ``StaleWeights``."""
    r, err = run_on_ray("0.9.1", [
        {"name": "clean"},
        {"name": "drop", "drop": DROP},
        {"name": "strict", "drop": DROP, "env": {"SHIM_STRICT": "1"}},
    ])
    assert r["actor_pid"] != r["driver_pid"], r
    for where in ("actor", "worker"):  # what the H200 actor's log said
        assert r["decisions"][where]["verify-weights-verl-server"] == "applied", r["decisions"]
        assert r["decisions"][where]["verify-weights-vllm-worker"] == "applied", r["decisions"]
    assert NO_DIGESTS not in err, [w for p in ("clean", "drop", "strict") for w in r[p]["warnings"]]
    assert r["clean"]["differs"] == [] and r["clean"]["warnings"] == [], r["clean"]
    assert r["clean"]["counts"] == {"verified": 1, "stale": 0, "unverifiable": 0}, r["clean"]
    assert r["drop"]["differs"] == [DROP], r["drop"]  # the fault is real: the engine kept the old tensor
    assert r["drop"]["counts"] == {"verified": 0, "stale": 1, "unverifiable": 0}, r["drop"]
    (warning,) = r["drop"]["warnings"]
    assert "stale weights" in warning and f"first differing: {DROP})" in warning, warning
    assert r["strict"]["raised"] == "StaleWeights" and r["strict"]["counts"]["stale"] == 1, r["strict"]
