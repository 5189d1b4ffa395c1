"""``ray-cluster-workers`` stands down on a Ray whose ``connect`` changed under it (the contract's ``shape`` case
deletes ``connect``; here the finer changes the probe reads, each on a copy of the real ray 2.49.2 module): a
``connect`` without ``node`` / ``mode`` / ``job_config``, a ``SCRIPT_MODE`` that is not 0, no upload of a
``worker_process_setup_hook``. Wrapping there would hand Ray a runtime_env it ignores, or misread a worker's
``connect`` for a driver's; the real module passes."""

from tests.support.envs import verl_deps_path
from tests.support.helpers import clean_env, last_json, run_python

CODE = """
import json, types
import ray._private.worker as real
from patches.ray_cluster import PATCHES

probe = PATCHES[0].probe
def copy(**change):
    module = types.ModuleType(real.__name__)
    module.__dict__.update({k: v for k, v in vars(real).items() if k not in change or change[k] is not None})
    module.__dict__.update({k: v for k, v in change.items() if v is not None})
    for k, v in change.items():
        if v is None:
            module.__dict__.pop(k, None)
    return module
def connect_without(name):
    import inspect
    sig = inspect.signature(real.connect)
    def connect(*args, **kwargs):
        pass
    connect.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != name])
    return connect
print(json.dumps({
    "real": probe(real),
    "no_job_config": probe(copy(connect=connect_without("job_config"))),
    "no_mode": probe(copy(connect=connect_without("mode"))),
    "script_mode": probe(copy(SCRIPT_MODE=1)),
    "no_hook_upload": probe(copy(upload_worker_process_setup_hook_if_needed=None)),
}))
"""


def test_the_probe_stands_down_on_each_change_it_reads():
    out = last_json(run_python(CODE, path=[verl_deps_path()], env=clean_env()))
    assert out["real"] is None, out
    assert "no job_config parameter" in out["no_job_config"] and "no mode parameter" in out["no_mode"], out
    assert "SCRIPT_MODE is not 0" in out["script_mode"], out
    assert "does not upload a worker_process_setup_hook" in out["no_hook_upload"], out
