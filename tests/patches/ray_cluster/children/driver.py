"""A Ray driver joining the test's ``ray start`` cluster; prints one JSON line: what its actors see.

``ray.init(address="auto")``: the test pins ``RAY_ADDRESS`` to its own cluster. argv[1]: JSON ``{"auto" (import
shim.auto first), "hook" ("callable" | "string"), "user_module" (a package directory: the user's own py_modules,
with ``setup()``), "own_py_modules" (a second actor whose own runtime_env replaces the job's py_modules)}``. The
user's runtime_env: that hook, ``env_vars`` (one of them a SHIM_* switch the driver also sets), that py_modules
entry.
"""
import json
import os
import sys

SPEC = json.loads(sys.argv[1])
if SPEC["auto"]:
    import shim.auto  # noqa: F401

import ray

SWITCHES = ("SHIM_DISABLED_PATCHES", "SHIM_VERIFY_WEIGHTS", "SHIM_SUMMARY_EVERY", "SHIM_STRICT")


def user_hook():  # defined in __main__: Ray pickles it by value
    os.environ["TEST_USER_HOOK"] = "callable"


@ray.remote(num_cpus=0)
class Probe:
    def report(self):
        import importlib.util
        import os
        import sys

        shim = sys.modules.get("shim")
        out = {"pid": os.getpid(), "active": bool(shim is not None and shim.is_active()),
               "importable": importlib.util.find_spec("shim") is not None,
               "user_module": importlib.util.find_spec(os.environ["TEST_USER_MODULE"]) is not None,
               "env": {k: os.environ.get(k) for k in SWITCHES + ("TEST_USER_VAR", "TEST_USER_HOOK")}}
        if out["active"]:
            import subprocess

            from shim.engine import registry

            out["file"] = shim.__file__
            out["wrapt"] = getattr(sys.modules.get("wrapt"), "__file__", None)
            out["decisions"] = {k: v.decision for k, v in registry.decisions().items()}
            child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
            out["child"] = child.stdout.strip() or child.stderr[-2000:]  # a process the actor starts (vLLM's core)
        return out


CHILD = """
import importlib.util, json, os, sys
shim = sys.modules.get("shim")
print(json.dumps({"active": bool(shim and shim.is_active()), "wrapt": importlib.util.find_spec("wrapt") is not None,
                  "verify": os.environ.get("SHIM_VERIFY_WEIGHTS")}))
"""


user_dir = SPEC["user_module"]
ray.init(address="auto", log_to_driver=False, runtime_env={
    "worker_process_setup_hook": user_hook if SPEC["hook"] == "callable" else f"{os.path.basename(user_dir)}.setup",
    "env_vars": {"TEST_USER_VAR": "kept", "SHIM_SUMMARY_EVERY": "7", "TEST_USER_MODULE": os.path.basename(user_dir)},
    "py_modules": [user_dir],
})
try:
    result = {"driver_pid": os.getpid(), "actor": ray.get(Probe.remote().report.remote(), timeout=120)}
    if SPEC.get("own_py_modules"):
        job_modules = ray.get_runtime_context().runtime_env["py_modules"]  # URIs, the user's first
        other = Probe.options(runtime_env={"py_modules": job_modules[:1]}).remote()
        result["own_py_modules"] = ray.get(other.report.remote(), timeout=120)
finally:
    ray.shutdown()
print(json.dumps(result))
