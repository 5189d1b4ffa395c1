"""verl's HYBRID rollout server (``vLLMHttpServer``) on the vLLM stand-in's ``AsyncLLM``, for the verl patches.

``verl_environment(release)`` is the ``PYTHONPATH`` and variables of a child that imports a real verl release
(``tests/support/envs.py``: ``.envs/verl-<v>`` plus the shared ``verl-deps``) with the stand-in imitating the
vLLM that release's code is written for (0.7.1 / 0.8.0: ``vllm<=0.12.0``; 0.9.0: ``>=0.18``, the checked-in
0.24.0). ``run_sleep(release, tmp_path)`` runs :data:`SCENARIO` there: a bare ``vLLMHttpServer``
(``cls.__new__`` plus what its sleep and wake read: ``node_rank`` 0, ``rollout_mode`` HYBRID, ``config.mtp``
(verl's own ``MtpConfig``), ``config.free_cache_engine``, ``model_config`` without LoRA) whose ``engine`` is the
stand-in's ``AsyncLLM`` (engine core in a forked process) with an MTP drafter; verl's own ``sleep`` then the
wake verl does (0.7.1: ``collective_rpc("wake_up", tags)`` as ``ServerAdapter.resume``; 0.8.0+:
``wake_up(tags)``), weights first, then kv_cache. Once with the shim off, then activated (after the import),
then with MTP off. Each phase reports the levels that reached the worker and the drafter's state.
"""
from __future__ import annotations

from tests.support.helpers import REPO, clean_env, last_json, run_python

VLLM_FOR = {"0.7.1": "0.12.0", "0.8.0": "0.12.0", "0.9.0": "0.24.0"}


def verl_environment(release: str):
    from tests.support.envs import verl_paths
    from tests.support.trl_support import fake_site

    vllm = VLLM_FOR[release]
    env = {"FAKEVLLM_VERSION": vllm, "VLLM_WORKER_MULTIPROC_METHOD": "fork", "RAY_USAGE_STATS_ENABLED": "0"}
    return [fake_site(vllm), *verl_paths(release)], env


def drafter_state(worker) -> dict:
    """Run in the worker (``collective_rpc`` callable): the drafter's fingerprint and origin, or None."""
    drafter = getattr(worker.model_runner, "drafter", None)
    if drafter is None:
        return {"fp": None, "origin": None}
    return {"fp": drafter.weights_fp(), "origin": drafter.weights_origin}


SCENARIO = REPO / "tests" / "patches" / "verl_mtp_sleep_level" / "children" / "mtp_sleep.py"


def run_sleep(release: str, tmp_path) -> dict:
    from tests.support.swift_support import tiny_model

    path, extra = verl_environment(release)
    env = clean_env(**extra, FAKEVLLM_EVENTS=str(tmp_path / "events.jsonl"), TEST_MODEL=tiny_model(),
                    OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    return last_json(run_python(SCENARIO.read_text(), path=path, env=env, timeout=300))



