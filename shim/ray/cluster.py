"""The shim in the actors and tasks of a Ray job whose driver runs under it, on a cluster the driver joined.

``python -m shim CMD`` reaches every process CMD starts through ``PYTHONPATH``, and the workers of a cluster that
``ray.init()`` starts inherit it. The workers of a cluster started with ``ray start`` (multi-node verl, OpenRLHF,
ms-swift Ray) are children of the node's raylet, started with the raylet's environment: without this the shim
is off in every actor unless ``python -m shim install`` ran on every node. Bound to
``ray._private.worker.connect`` by ``patches/ray_cluster.py``: where the driver joined a cluster, :func:`merged`
adds the shim to the job's runtime_env through Ray's own fields. Nothing is added where ``ray.init()`` started
the cluster, in local mode, or for a Ray Client driver (``ray://``: Ray prepares that job's environment on the
server). The user's runtime_env objects are never changed (new dicts). Any error here is one WARNING and the
job starts with the runtime_env the user gave; ``SHIM_STRICT=1`` raises.
"""
from __future__ import annotations

import os

from shim.engine import call_args, config, log

SWITCHES = config.ALL + (config.DISABLED_PATCHES_REPORTED,)
"""The variables the job's workers get from the driver's environment (those set there)."""

SCRIPT_MODE = 0
"""``ray._private.worker.SCRIPT_MODE``: a driver's ``connect`` (the record's probe checks the value)."""

VENDOR = "_vendor"
"""Folder of the shipped package holding the driver's ``wrapt``, for a node that has none."""

SETUP_MARKER = "_shim_ray_setup"
"""Attribute of the shim's setup hook (a runtime_env merged twice keeps one)."""


def wrap_connect(wrapped, instance, args, kwargs):
    """wrapt wrapper for ``ray._private.worker.connect(node, session_name, mode=..., ..., job_config=...)``.

    The driver's ``connect`` receives the job's final runtime_env (``ray.init(runtime_env=...)``,
    ``JobConfig(runtime_env=...)``, a submitted job's own (``RAY_JOB_CONFIG_JSON_ENV_VAR``) and
    ``RAY_RUNTIME_ENV_HOOK`` already merged by ``ray.init``; read in ray 2.49.2 ``_private/worker.py``), and
    uploads it (``py_modules``, the setup hook) before the job's first worker starts. A joined cluster:
    ``node.head`` false (``Node(connect_only=True)``).
    """
    import shutil
    import tempfile

    staging = None
    try:
        try:
            job_config = call_args.arg(wrapped, args, kwargs, "job_config")
            if _joins_cluster(wrapped, args, kwargs, job_config):
                staging = tempfile.mkdtemp(prefix="shim-ray-")  # Ray uploads it inside ``connect``
                job_config.set_runtime_env(merged(job_config.runtime_env, package(staging)))
        except Exception as exc:
            if config.strict():
                raise
            log.warning(f"ray-cluster-workers: the shim is not sent to this Ray job's workers "
                        f"({type(exc).__name__}: {exc}); the job runs with the runtime_env you gave")
        return wrapped(*args, **kwargs)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _joins_cluster(wrapped, args, kwargs, job_config) -> bool:
    """A driver (not a worker, not local mode) joining a cluster it did not start, not through Ray Client."""
    if job_config is None or getattr(job_config, "_client_job", False):
        return False
    if call_args.arg(wrapped, args, kwargs, "mode") != SCRIPT_MODE:
        return False
    node = call_args.arg(wrapped, args, kwargs, "node")
    return node is not None and not getattr(node, "head", True)


def merged(runtime_env, shim_dir: str) -> dict:
    """A new runtime_env: ``runtime_env`` (a dict or Ray's ``RuntimeEnv``, or None) with the shim's setup hook
    (chaining the user's), ``SHIM_*`` switches (the user's ``env_vars`` win) and ``shim_dir`` after the
    user's ``py_modules``. ``runtime_env`` itself is left as it was.

    - ``worker_process_setup_hook``: a function that activates the shim in the worker process before it
      runs a task, then calls the user's own hook (a callable or a ``"module.function"`` string), whose
      errors stay the user's (Ray reports them as without the shim). The function is pickled by value
      (defined in :func:`setup_hook`, it references nothing of the shim's), so it loads in every worker:
      where the shim is not importable (an actor whose own runtime_env replaces ``py_modules``) it prints
      one line and the user's hook still runs: the shim never stops a worker.
    - ``env_vars``: the driver's ``SHIM_*`` switches (``shim.engine.config.ALL``), so an actor behaves as
      the driver asked (disable list, verification, trace, strict); the user's own ``env_vars`` win.
    - ``py_modules``: this ``shim`` package (``shim.patches`` inside it, also from a source checkout),
      after the user's own entries. Always on a joined cluster: the driver cannot see which nodes have the
      shim installed (nodes join later), the package is 1.3 MB (0.43 MB zipped, wrapt's included),
      uploaded once per content (Ray names it by its hash, in the cluster's store) and unpacked once per
      node, and the actors then run the driver's own release (the two halves of a weight verification,
      the ids of the disable list) even where a node has another one. The driver's ``wrapt`` (the shim's
      one dependency Ray does not require; ``packaging`` it does) travels inside it (``shim/_vendor``),
      and the hook puts it at the END of the worker's path only where the node has no ``wrapt``: a
      node's own ``wrapt`` is never shadowed.
    """
    result = dict(runtime_env or {})
    env_vars = {name: os.environ[name] for name in SWITCHES if os.environ.get(name)}
    env_vars.update(result.get("env_vars") or {})
    if env_vars:
        result["env_vars"] = env_vars
    hook = result.get("worker_process_setup_hook")
    if not getattr(hook, SETUP_MARKER, False):
        result["worker_process_setup_hook"] = setup_hook(hook)
    modules = list(result.get("py_modules") or [])
    if shim_dir not in modules:
        result["py_modules"] = modules + [shim_dir]
    return result


def package(staging: str) -> str:
    """This ``shim`` package copied to ``staging/shim`` (``.py`` files and the bootstrap; ``shim.patches``
    inside it, wherever it was imported from: a source checkout keeps it beside ``shim/``); returns the path."""
    import shutil
    import sys

    import shim
    from shim.engine import catalog

    source = os.path.dirname(os.path.abspath(shim.__file__))
    target = os.path.join(staging, "shim")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", VENDOR))  # a shipped copy's
    catalog.index()  # ``shim.patches`` loaded (activation read it already)
    patches = os.path.dirname(os.path.abspath(sys.modules[catalog.PACKAGE].__file__))
    if not os.path.isdir(os.path.join(target, "patches")):
        shutil.copytree(patches, os.path.join(target, "patches"), ignore=ignore)
    import wrapt

    shutil.copytree(os.path.dirname(os.path.abspath(wrapt.__file__)), os.path.join(target, VENDOR, "wrapt"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.c"))
    return target



def setup_hook(user_hook=None):
    """The job's ``worker_process_setup_hook``: activate the shim in this worker, then run ``user_hook`` (None,
    a callable, or Ray's ``"module.function"`` string form). Defined here so that cloudpickle sends it by value:
    its code references nothing of the shim's, and a worker without the shim still loads and runs it."""

    def shim_worker_setup():
        import importlib.util
        import os
        import sys

        try:
            import shim

            activate = shim.activate
        except (ImportError, AttributeError) as exc:
            print(f"[shim] WARNING the shim is not importable in this Ray worker ({type(exc).__name__}: {exc}): "
                  f"not active here (does this actor's runtime_env replace the job's py_modules?)", file=sys.stderr)
        else:
            vendor = os.path.join(os.path.dirname(os.path.abspath(shim.__file__)), vendor_name)
            if os.path.isdir(vendor) and importlib.util.find_spec("wrapt") is None:  # last: never the node's own
                sys.path.append(vendor)
                os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), vendor) if p)
            activate()  # never raises, except under SHIM_STRICT=1 (asked for)
        if user_hook is None:
            return
        hook = user_hook
        if isinstance(hook, str):  # what Ray does with the string form (``ray._common.utils.load_class``)
            import importlib

            module, _, name = hook.rpartition(".")
            hook = getattr(importlib.import_module(module), name)
        hook()

    vendor_name = VENDOR  # a closure cell: the function references no global of this module
    setattr(shim_worker_setup, SETUP_MARKER, True)
    return shim_worker_setup
