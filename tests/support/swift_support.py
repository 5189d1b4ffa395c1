"""Run code in one ms-swift release's venv on the vLLM stand-in (``run_in_swift``), e.g.
``tests/scenarios/swift_run.py`` (``run_swift``)."""
from __future__ import annotations

import functools
import os
import subprocess
import tempfile

from shim.vllm.sleep.alloc_guard import ENV_VARS as ALLOC_VARS
from tests.support import warm
from tests.support.helpers import REPO, clean_env, last_json, rendezvous_port
from tests.support.swift_envs import swift_python, swift_pythonpath
from tests.support.trl_support import fake_site

SCENARIO = REPO / "tests" / "scenarios" / "swift_run.py"


def vllm_for(swift_version: str) -> str:
    """3.10.x pins trl 0.24, which imports GuidedDecodingParams (vLLM < 0.12)."""
    return "0.10.2" if swift_version.startswith("3.") else "0.24.0"


@functools.lru_cache(maxsize=None)
def tiny_model() -> str:
    from tests.support.helpers import run_python

    target = REPO / ".envs" / "tiny-model"
    if not (target / "config.json").exists():
        tmp = tempfile.mkdtemp(dir=REPO / ".envs", prefix="tiny-model.tmp")
        run_python(f"import sys; sys.path.insert(0, 'tests'); import tiny; tiny.make_tiny_model({tmp!r})")
        try:
            os.rename(tmp, target)
        except OSError:
            pass
    return str(target)


def run_in_swift(version: str, argv: list, env: dict | None = None, check: bool = True,
                 vllm_version: str | None = None) -> dict | subprocess.CompletedProcess:
    """``python ARGV`` in the ms-swift <version> venv with the vLLM stand-in and the repository on
    PYTHONPATH, offline, its own rendezvous port and cwd; only ``env`` sets allocator variables.
    Returns the child's last JSON line (``check``) or the finished process."""
    vllm_version = vllm_version or vllm_for(version)
    device = (env or {}).get("FAKEVLLM_DEVICE", "cuda")
    out = tempfile.mkdtemp(prefix=f"swift-{version}-")
    port = rendezvous_port()  # each run its own (parallel test workers)
    # DS_ACCELERATOR=cpu: deepspeed would pick the (fake) NPU accelerator in NPU mode
    environment = clean_env(FAKEVLLM_VERSION=vllm_version, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                            DS_ACCELERATOR="cpu", MASTER_PORT=port,
                            TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
                            MODELSCOPE_CACHE=os.path.join(out, "ms"))
    for name in ALLOC_VARS:  # only the case's own allocator setting
        environment.pop(name, None)
    environment.update({k: str(v) for k, v in (env or {}).items()})
    environment["PYTHONPATH"] = os.pathsep.join([fake_site(vllm_version, device), str(REPO),
                                                 *swift_pythonpath(version)])
    proc = warm.run(swift_python(version), argv, environment, out, 900)  # warm: torch imported once per server
    if not check:
        return proc
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-6000:]}")
    return last_json(proc)


def run_swift(version: str, *args: str, env: dict | None = None, check: bool = True) -> dict | subprocess.CompletedProcess:
    """``tests/scenarios/swift_run.py`` (the real RolloutTrainerMixin) with ``args``."""
    out = tempfile.mkdtemp(prefix=f"swift-{version}-run-")
    return run_in_swift(version, [SCENARIO, "--model", tiny_model(), "--out", out, *args], env=env, check=check)


# the wakes of vLLM's weights in a rollout's ``order`` (tests/scenarios/swift_run.py, swift_megatron_run.py --offload)
PUSH = (True, ["weights"])  # before offload_context, the trainer still on the device: needed for a push
AFTER_OFFLOAD = (False, ["weights", "kv_cache"])  # inside offload_context, with the KV cache (ms-swift 4.6.0)


def weights_wakes(run: dict) -> dict:
    """Per step, each wake that maps vLLM's weights: (trainer model on the device at that moment, tags)."""
    wakes = {}
    for w in run["order"]:
        if w["event"] == "wake_up" and "weights" in (w["tags"] or ["weights"]):
            wakes.setdefault(w["step"], []).append((w["trainer_on_device"], w["tags"]))
    return wakes
