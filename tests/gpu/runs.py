"""Launch several ``tests/gpu/grpo_run.py`` processes on one GPU and collect their JSON.

Used by ``bench/gpu_trl_5312.py`` (parallel: correctness), ``bench/gpu_step_cost.py``
(one after the other: timing) and ``examples/trl_grpo_colocate.py``.

Every process is started at once, so the imports of vLLM and TRL (tens of
seconds) overlap; what each does on the GPU is ordered by marker files
(``common.Gate``): by default one after the other (the marker of a process is
written when it has exited). ``parallel=True`` lets all use the GPU together
(after a barrier once CUDA is up); it is faster but not robust: vLLM's worker
measures each sleep with the device-wide ``mem_get_info`` and asserts
``freed_bytes >= 0``, so another process allocating during a sleep of a small
engine fails the run ("Memory usage increased after sleeping"; seen on the
H200 with five tiny-model runs at once). Each process also holds the device
lock (tests/gpu/devlock.py) from its turn to its exit, shared in that mode;
a run that still dies on that assert is run once more, alone (``retried``).
"""
from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass, field

from tests.gpu import common

OVERLAP = common.SLEEP_OVERLAP


@dataclass
class Run:
    label: str
    trl: str
    sleep: str = "on"
    shim: str = "off"
    trace: str = ""
    extra: list = field(default_factory=list)
    env: dict = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in self.label)


def trl_paths(specs: list) -> dict:
    """``["1.9.2=/tmp/trl-1.9.2", ...]`` -> {version: path}; a version without a path is
    installed into .envs/ by tests.support.envs (needs the package index)."""
    out = {}
    for spec in specs or []:
        version, _, path = spec.partition("=")
        out[version] = path
    return out


def trl_path(version: str, paths: dict) -> "str | None":
    """Folder to put first on PYTHONPATH for ``version`` (None: the TRL installed here)."""
    if not version:
        return None
    if paths.get(version):
        return paths[version]
    from tests.support.envs import trl_path as install

    return str(install(version))


def run_all(runs: list, model: str, workdir, *, trl: dict, pythonpath=(), parallel: bool = False, after=(),
            common_args=(), need_s: float = 90.0, env=None, timeout: float = 900.0, done_marker=None) -> dict:
    """Run ``runs``; returns {label: result dict} (a result has ``error`` when a run failed).

    A run that died on vLLM's "Memory usage increased after sleeping" (another process allocated on the
    device during one of its sleeps: ``parallel``, or a process outside the device lock) is run once
    more, alone, after every other run has exited; its result says so (``retried``).
    ``done_marker`` (a path) is written once every process has exited."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    barrier = f"{workdir / 'barrier'}:start:{len(runs)}" if parallel and len(runs) > 1 else ""

    def start(run, previous, barrier, suffix=""):
        out = workdir / f"{run.slug}{suffix}.json"
        log = workdir / f"{run.slug}{suffix}.log"
        marker = workdir / f"{run.slug}{suffix}.done"
        for stale in (out, marker):
            if stale.exists():
                stale.unlink()
        args = ["--model", model, "--out", out, "--label", run.label, "--sleep", run.sleep, "--shim", run.shim,
                "--need-s", need_s, *common_args, *run.extra]
        if run.trace:
            args += ["--trace", run.trace]
        if barrier:
            args += ["--barrier", barrier]
        if previous:
            args += ["--after", *previous]
        child_env = {**env_for_runs(), **(env or {}), **run.env, "MASTER_PORT": common.free_port()}  # port per process
        proc = common.launch(common.GRPO_RUN, args, log, env=child_env,
                             pythonpath=[p for p in (trl_path(run.trl, trl), *pythonpath) if p])
        return run, proc, out, log, marker

    def collect(run, proc, out, log, marker, end):
        rc = common.finish(proc, marker, timeout=max(end - time.time(), 1))
        result = common.read_json(out) or {}
        result.setdefault("label", run.label)
        result["rc"] = rc
        result["log"] = str(log)
        if rc != 0 or not result.get("metrics") and not result.get("skipped"):
            result["error"] = f"exit {rc}: " + common.tail(log, 12)
        return result

    procs = []
    previous = list(after)
    for run in runs:
        procs.append(start(run, previous, barrier))
        if not parallel:
            previous = [str(procs[-1][4])]
    results = {}
    end = time.time() + timeout
    for item in procs:
        results[item[0].label] = collect(*item, end)
    for run, _proc, _out, log, _marker in procs:
        first = results[run.label]
        if first.get("error") and common.sleep_overlap_crash(log):
            reason = (f"vLLM's sleep check failed (another process allocated during a sleep: {OVERLAP}); "
                      f"run once more, alone")
            print(f"[runs] {run.label}: {reason}", flush=True)
            again = collect(*start(run, [str(p[4]) for p in procs], "", suffix=".retry"), end)
            again["retried"] = reason
            again["first_attempt"] = {k: first.get(k) for k in ("rc", "error", "log")}
            results[run.label] = again
    if done_marker:
        pathlib.Path(done_marker).touch()
    return results


def mean_after_first(values):
    xs = [v for v in (values or [])[1:] if isinstance(v, (int, float))]
    return sum(xs) / len(xs) if xs else None


def env_for_runs() -> dict:
    """Variables every run gets (offline; no W&B)."""
    return {"WANDB_DISABLED": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")}
