"""Actors and tasks of a Ray cluster started with ``ray start`` run without the shim unless every node installed it.

Upstream: none (a feature of the shim's activation, issue 30 item 4: multi-node verl, OpenRLHF, ms-swift Ray): a
          worker of a ``ray start`` cluster is the raylet's child, so ``python -m shim``'s ``PYTHONPATH`` misses it
Affects:  ray >=2.10.0 (``runtime_env`` ``worker_process_setup_hook``; read in ray 2.49.2), a driver joining a
          cluster it did not start (``ray.init(address=...)``, ``RAY_ADDRESS``, ``ray job submit``)
Remove:   never (a feature)

The driver's ``connect`` is wrapped, not ``ray.init``: a runtime_env field added there conflicts with a submitted
job's own (``_merge_runtime_env`` refuses the job), and ``ray/__init__`` binds ``init`` by name. Stands down where
``connect`` has no ``node`` / ``mode`` / ``job_config`` parameter or Ray has no setup hook.
"""
from shim.engine.patch import FEATURE, Patch
from shim.engine.probes import changed, params

ID = "ray-cluster-workers"


def _probe(module):
    connect = getattr(module, "connect", None)
    if not callable(connect):
        return changed("ray._private.worker.connect not found")
    names, reason = params(connect, "ray._private.worker.connect")
    if reason:
        return reason
    missing = [name for name in ("node", "mode", "job_config") if name not in names]
    if missing:
        return changed(f"ray._private.worker.connect has no {', '.join(missing)} parameter")
    from shim.ray.cluster import SCRIPT_MODE

    if getattr(module, "SCRIPT_MODE", None) != SCRIPT_MODE:
        return changed(f"ray._private.worker.SCRIPT_MODE is not {SCRIPT_MODE}")
    if not callable(getattr(module, "upload_worker_process_setup_hook_if_needed", None)):
        return changed("ray._private.worker does not upload a worker_process_setup_hook")
    return None


def _apply(module, patcher):
    from shim.ray import cluster

    patcher.wrap(module, "connect", cluster.wrap_connect)


PATCHES = [
    Patch(
        id=ID,
        kind=FEATURE,
        tested_at=("ray", "2.49.2"),
        issue="Ray workers of a `ray start` cluster",
        distribution="ray",
        affected=">=2.10.0",
        module="ray._private.worker",
        apply=_apply,
        probe=_probe,
        summary="a driver under the shim joining a Ray cluster gives its job's workers the shim through the "
                "job's runtime_env (setup hook, SHIM_* switches, the shim as py_modules), merged with the user's",
        changes=("the driver's `ray._private.worker.connect` (a driver joining a cluster it did not start: `ray "
                 "start`, `ray job submit`): the job's final runtime_env (`ray.init`'s, `JobConfig`'s, a submitted "
                 "job's, merged by Ray) gets a `worker_process_setup_hook` that activates the shim and then runs "
                 "the user's hook (callable or `\"module.function\"`; pickled by value, so a worker without the shim "
                 "still runs the user's hook), the driver's `SHIM_*` switches in `env_vars` (the user's win) and "
                 "this `shim` package in `py_modules` (after the user's; `shim.patches` inside, also from a "
                 "checkout; the driver's `wrapt` inside it, put LAST on the worker's path only where the node has "
                 "no `wrapt`). The user's objects are not changed. Nothing added when `ray.init()` started the "
                 "cluster (its workers inherit `PYTHONPATH`), in local mode or for Ray Client"),
        verified=("CPU: `tests/patches/ray_cluster/test_ray_start.py`: a real `ray start --head --block` cluster "
                  "(ray 2.49.2, loopback, node interpreter without the shim and without `wrapt`, raylet "
                  "`PYTHONPATH` without the shim: asserted): `import shim.auto` and `python -m shim` drivers, the "
                  "actor (a raylet child) has the shim active from the shipped copy, its own decisions (wrapt the "
                  "shipped one), the driver's disable list and switches, a process the actor starts active too; "
                  "the user's hook (callable, string), `env_vars` (winning on `SHIM_SUMMARY_EVERY`) and "
                  "`py_modules` kept; an actor with its own `py_modules` starts without the shim; with the record "
                  "disabled the actor has no shim (not importable)"),
    ),
]
