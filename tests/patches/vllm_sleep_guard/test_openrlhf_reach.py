"""The worker-level sleep check reaches OpenRLHF's rollout engines (issue #21, item 4).

OpenRLHF 0.11.2 (``.envs/openrlhf-0.11.2``, ``tests/support/envs.py``; vLLM stand-in at 0.29.0, the release's pin)
builds each rollout engine as a Ray actor, ``openrlhf/trainer/ray/vllm_engine.py`` ``RolloutRayActor``: its
``__init__`` makes ``vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(...))`` (V1: ``AsyncLLM``) with
``distributed_executor_backend="uni"`` (tensor parallel 1), ``enable_sleep_mode`` from ``--vllm.enable_sleep`` and
``worker_extension_cls="openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap"``. The engine core, and with it vLLM's
``Worker`` and the sleep pool, runs in a process the actor spawns; only the worker-level records
(``vllm-worker-sleep-guard`` / ``vllm-worker-sleep-check``) see that memory.

The child (``children/openrlhf_reach.py``) builds the engine through OpenRLHF's own ``create_vllm_engines`` (the
real kwargs, then its first sleep) and runs two steps of its PPO loop with its own ``batch_vllm_engine_call``:
``wake_up(tags=["weights"])`` (``PPOTrainer.broadcast_to_vllm``), ``reset_prefix_cache``, ``wake_up()`` (weights,
then kv_cache, one call each), ``generate``, ``sleep()`` (level 1). No Ray cluster: the class under ``@ray.remote``
(``RolloutRayActor.__ray_actor_class__``) runs on an event loop in the child, ``ray.get`` waits for it. Run under
``python -m shim --trace`` and without the shim; the engine core is spawned (vLLM forces spawn in a Ray actor).

Not covered: Ray's own worker processes (whether ``python -m shim`` reaches the actor's process is Ray's
environment propagation: measured by hand with ray 2.49.2, a cluster the driver's ``ray.init()`` starts, or one
``ray start`` ran under the shim, gives activated workers; a ``ray start`` apart does not: README, Troubleshooting),
and the weight broadcast itself (NCCL / CUDA IPC into ``WorkerWrap.update_weight``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO, clean_env

PROGRAM = Path(__file__).parent / "children" / "openrlhf_reach.py"
RELEASE = "0.11.2"
SLEEPS = 3  # create_vllm_engines' sleep, then one per step

pytestmark = pytest.mark.xdist_group("openrlhf_reach")  # the two runs below are made once, on one worker


def _run(folder: Path, shim: bool) -> dict:
    from tests.support.openrlhf_support import openrlhf_environment
    from tests.support.swift_support import tiny_model

    path, extra = openrlhf_environment(RELEASE)
    env = clean_env(**extra, TEST_MODEL=tiny_model(), FAKEVLLM_EVENTS=str(folder / "events.jsonl"),
                    VLLM_LOGGING_LEVEL="ERROR", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                    HF_HUB_OFFLINE="1")
    for k in list(env):
        if k.startswith(("FAKEVLLM_", "PYTORCH_")) and k not in ("FAKEVLLM_VERSION", "FAKEVLLM_EVENTS") \
                or k in ("RANK", "LOCAL_RANK"):
            del env[k]
    env["PYTHONPATH"] = os.pathsep.join([*path, str(REPO)])
    command = [sys.executable, "-c", PROGRAM.read_text()]
    if shim:
        command = [sys.executable, "-m", "shim", "--trace", str(folder / "trace.jsonl")] + command
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=str(REPO), timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"

    def lines(p):
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []

    return {"R": json.loads(proc.stdout.strip().splitlines()[-1]), "trace": lines(folder / "trace.jsonl"),
            "events": lines(folder / "events.jsonl"), "stderr": proc.stderr}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(on, off)``, one after the other (each spawns an engine core: two at once would double the load)."""
    return _run(tmp_path_factory.mktemp("on"), True), _run(tmp_path_factory.mktemp("off"), False)


def test_openrlhf_builds_its_engine_core_in_another_process(runs):
    """What the claim rests on: OpenRLHF's own kwargs, an AsyncLLM, its first sleep, a separate engine core."""
    for run in runs:
        r = run["R"]
        assert r["engine_class"] == "AsyncLLM" and r["sleeping_after_create"] is True
        (built,) = r["built"]
        assert built["kwargs"] == {"distributed_executor_backend": "uni", "enable_sleep_mode": True,
                                   "worker_extension_cls": "openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap",
                                   "enable_prefix_caching": True}
        assert r["core"] != r["parent"] and r["worker"]["pid"] == r["core"]
        assert len([e for e in run["events"] if e["event"] == "worker_sleep" and e["pid"] == r["core"]]) == SLEEPS
    assert runs[0]["R"]["tokens"] == runs[1]["R"]["tokens"]  # the shim changes no output


def test_worker_sleep_check_runs_in_openrlhf_engine_core(runs):
    on, _ = runs
    r = on["R"]
    core, parent = r["core"], r["parent"]
    # reached through the bootstrap on PYTHONPATH: the spawned engine core activated itself
    assert any(x["event"] == "activate" and x["pid"] == core and x["ppid"] == parent for x in on["trace"])
    sleeps = [x for x in on["trace"] if x["event"] == "sleep"]
    assert len(sleeps) == SLEEPS, on["trace"]
    assert all(x["pid"] == core and x["ppid"] == parent and x["engine"].startswith("Worker#") and x["level"] == 1
               and x["effective"] is True and x["freed"] >= 0.9 * x["tracked"] > 0 for x in sleeps)
    # OpenRLHF's per-tag wakes: the weights for the sync, then the KV cache before generation (its second
    # weights wake finds the weights awake: vLLM's executor passes nothing to the worker)
    wakes = [x["tags"] for x in on["trace"] if x["event"] == "wake" and x["pid"] == core]
    assert wakes == [["weights"], ["kv_cache"]] * 2
    # the decisions in the engine core's worker (``python -m shim status`` rows there): applied, and acted
    rows = r["worker"]["rows"]
    assert set(rows) == {"vllm-worker-sleep-guard", "vllm-worker-sleep-check"}
    assert all(row["decision"] == "applied" and row["acted"] > 0 and row["installed"] == "0.29.0"
               for row in rows.values()), rows
    # the actor's own process holds no worker: nothing acted there
    assert all(row["acted"] == 0 for row in r["here"].values()), r["here"]
    assert "[shim] INFO sleep Worker#" in on["stderr"]


def test_without_the_shim_no_worker_record(runs):
    _, off = runs
    assert off["trace"] == [] and "[shim]" not in off["stderr"]
    rows = off["R"]["worker"]["rows"]
    assert all(row["decision"] == "waiting" and row["reason"] == "shim not activated in this process"
               and row["acted"] == 0 for row in rows.values()), rows
