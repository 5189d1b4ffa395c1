"""``shim.ray.cluster.merged``: the user's runtime_env is merged into a new dict, never changed, and merging twice
adds the shim once (in process: no Ray needed). That the hook loads and runs the user's where the shim is not
importable: ``test_ray_start.py`` (an actor with its own ``py_modules``)."""
import copy

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

