"""``shim.ray.cluster.merged``: the user's runtime_env is merged into a new dict, never changed, and merging twice
adds the shim once (in process: no Ray needed). That the hook loads and runs the user's where the shim is not
importable: ``test_ray_start.py`` (an actor with its own ``py_modules``)."""
import copy
import os
import tempfile

from shim.ray import cluster


def user_hook():
    pass


def test_the_users_runtime_env_is_left_as_it_was_and_a_second_merge_adds_nothing(monkeypatch):
    monkeypatch.setenv("SHIM_VERIFY_WEIGHTS", "1")
    monkeypatch.setenv("SHIM_STRICT", "1")
    user = {"env_vars": {"SHIM_STRICT": "0", "A": "1"}, "py_modules": ["/user/pkg"],
            "worker_process_setup_hook": user_hook, "working_dir": "/user/wd"}
    before = copy.deepcopy(user)
    once = cluster.merged(user, "/staging/shim")
    assert user == before and user["worker_process_setup_hook"] is user_hook
    assert once["env_vars"] == {"SHIM_VERIFY_WEIGHTS": "1", "SHIM_STRICT": "0", "A": "1"}  # the user's value wins
    assert once["py_modules"] == ["/user/pkg", "/staging/shim"] and once["working_dir"] == "/user/wd"
    hook = once["worker_process_setup_hook"]
    assert getattr(hook, cluster.SETUP_MARKER) and hook.__closure__ and user_hook in \
        [c.cell_contents for c in hook.__closure__]
    twice = cluster.merged(once, "/staging/shim")
    assert twice["worker_process_setup_hook"] is hook and twice["py_modules"] == once["py_modules"]



class Node:
    def __init__(self, head):
        self.head = head


class JobConfig:  # what ``connect`` reads and sets of Ray's JobConfig
    def __init__(self, runtime_env, client=False):
        self.runtime_env, self._client_job = runtime_env, client

    def set_runtime_env(self, runtime_env, validate=False):
        self.runtime_env = runtime_env


def connect(node, session_name, mode=1, log_to_driver=False, worker=None, job_id=None, namespace=None,
            job_config=None):
    """Ray's ``connect`` as far as the wrapper reads it: what the job's runtime_env is while Ray uploads it."""
    return dict(job_config.runtime_env or {}) if job_config is not None else None


def test_only_a_driver_joining_a_cluster_it_did_not_start_changes_the_job(monkeypatch):
    """A driver that started the cluster (``node.head``: its workers inherit the shim), a worker's own ``connect``,
    Ray Client and local mode keep the user's runtime_env; a driver joining one gets the shim's (and the staging
    folder of the shipped package is gone once ``connect`` returned: Ray uploaded it)."""
    user = {"env_vars": {"A": "1"}}
    call = lambda node, mode, **kw: cluster.wrap_connect(connect, None, (node, "session"),  # noqa: E731
                                                         {"mode": mode, "job_config": JobConfig(dict(user), **kw)})
    assert call(Node(head=True), 0) == user
    assert call(Node(head=False), 1) == user  # WORKER_MODE
    assert call(Node(head=False), 2) == user  # LOCAL_MODE
    assert call(Node(head=False), 0, client=True) == user
    joined = call(Node(head=False), 0)
    assert joined["env_vars"] == {"A": "1"} and getattr(joined["worker_process_setup_hook"], cluster.SETUP_MARKER)
    (shipped,) = joined["py_modules"]
    assert shipped.endswith(f"{os.sep}shim") and not os.path.exists(shipped)


def test_an_error_here_leaves_the_job_as_the_user_gave_it_and_strict_raises(monkeypatch):
    def fails(staging):
        raise OSError("no space left on device")

    lines, made = [], []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    monkeypatch.setattr(cluster, "package", fails)
    monkeypatch.setattr(cluster.log, "warning", lines.append)
    monkeypatch.delenv("SHIM_STRICT", raising=False)
    user = {"env_vars": {"A": "1"}}
    job = JobConfig(dict(user))
    assert cluster.wrap_connect(connect, None, (Node(head=False), "session"), {"mode": 0, "job_config": job}) == user
    assert len(lines) == 1 and "not sent to this Ray job's workers (OSError: no space left on device)" in lines[0]
    monkeypatch.setenv("SHIM_STRICT", "1")
    try:
        cluster.wrap_connect(connect, None, (Node(head=False), "session"), {"mode": 0, "job_config": job})
    except OSError:
        pass
    else:
        raise AssertionError("SHIM_STRICT=1 did not raise")
    assert len(made) == 2 and not any(os.path.exists(path) for path in made), made  # no staging folder left
