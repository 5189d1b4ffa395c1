"""OpenRLHF's rollout engine on the vLLM stand-in, for the tests that the worker-level patches reach it.

``openrlhf_environment(release)`` is the ``PYTHONPATH`` and variables of a child that imports a real OpenRLHF
release (``tests/support/envs.py``: ``.envs/openrlhf-<v>`` plus the verl envs' shared packages, for ray) with the
stand-in imitating the vLLM that release pins. ``worker_rows`` runs in vLLM's worker (a ``collective_rpc``
callable, so it lives in an importable module: the engine core is spawned).
"""
from __future__ import annotations

VLLM_FOR = {"0.11.2": "0.29.0"}
"""The vLLM each OpenRLHF release pins (extra ``vllm``: ``vllm==0.29.0``)."""

WORKER_PATCHES = ("vllm-worker-sleep-guard", "vllm-worker-sleep-check")


def openrlhf_environment(release: str):
    """``(path, env)`` of a child importing OpenRLHF ``release`` on the stand-in imitating its vLLM.
    ``RAY_ADDRESS``: what a Ray worker process has; ``RolloutRayActor._configure_vllm_env`` reads
    ``global_worker.gcs_client`` without it (no cluster here). ``VLLM_WORKER_MULTIPROC_METHOD=spawn``: vLLM forces
    spawn inside a Ray actor (``vllm.utils.system_utils._maybe_force_spawn``: ``is_in_ray_actor()``)."""
    from tests.support.envs import openrlhf_paths
    from tests.support.stand_in import site

    vllm = VLLM_FOR[release]
    env = {"FAKEVLLM_VERSION": vllm, "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ADDRESS": "127.0.0.1:6379"}
    return [site(vllm, "cuda"), *openrlhf_paths(release)], env


def worker_rows(worker) -> dict:
    """Run in the worker: its pid and the ``python -m shim status --json`` rows of the worker-level patches there
    (``shim.cli.status`` without its ``shim.activate()``: a process the shim did not reach stays off)."""
    import os

    from shim.engine import catalog, registry

    patches = [p for p in catalog.all_patches() if p.id in WORKER_PATCHES]
    return {"pid": os.getpid(), "rows": {r["id"]: r for r in registry.status_rows(patches)}}
