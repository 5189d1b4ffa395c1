"""The sleep check where the memory lives: vLLM's engine core in its own process (``AsyncLLM``).

``vllm-worker-sleep-guard`` / ``vllm-worker-sleep-check`` (patches/vllm_sleep_guard.py) on the
stand-in's ``AsyncLLM`` (tests/fakevllm/vllm/v1/engine/async_llm.py), whose engine core and
``Worker`` run in a subprocess started with spawn or fork (``VLLM_WORKER_MULTIPROC_METHOD``). The
trainer process runs under ``python -m shim --trace`` (spawn: the child activates through the
bootstrap on PYTHONPATH; fork: it inherits the activation). Each claim is asserted with the shim
off too (one run, fork: the engine core is the same program either way), inside the same test.

The run: engine A (sleep mode; torch of the bypass era with ``PYTORCH_ALLOC_CONF=
expandable_segments:True``, ms-swift #6636's route): 2 generate/sleep/wake cycles, the second waking
the weights and then both tags (``vllm-core-wake-plan``), and a rollout after them. Fork runs only:
engine B (built without sleep mode: a sleep that frees nothing), then an in-process ``vllm.LLM``
in the trainer's process (TRL colocate) with 2 cycles.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import REPO, clean_env
from tests.support.stand_in import site

GiB = 1 << 30

PROGRAM = Path(__file__).parent / "children" / "engine_core.py"

pytestmark = pytest.mark.xdist_group("engine_core")  # the two runs below are made once, on one worker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.tiny import make_tiny_model

    return make_tiny_model(str(tmp_path_factory.mktemp("tiny") / "m"), seed=0)


def _start(model_dir: str, folder, shim: "str | None", engines: str, in_process: bool):
    """``shim``: "cli" (``python -m shim --trace``), "auto" (``import shim.auto`` in the program, ``SHIM_TRACE``) or None."""
    env = clean_env(TEST_MODEL=model_dir, TEST_ENGINES=engines, FAKEVLLM_TORCH="old",
                    PYTORCH_ALLOC_CONF="expandable_segments:True", FAKEVLLM_EVENTS=str(folder / "events.jsonl"),
                    VLLM_LOGGING_LEVEL="ERROR", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for k in list(env):
        if k.startswith("FAKEVLLM_") and k not in ("FAKEVLLM_TORCH", "FAKEVLLM_EVENTS") or k in ("RANK", "LOCAL_RANK"):
            del env[k]
    if in_process:
        env["TEST_IN_PROCESS"] = "1"
    env["PYTHONPATH"] = f"{site('0.24.0', 'cuda')}:{REPO}"
    if shim == "auto":
        env.update(TEST_AUTO="1", SHIM_TRACE=str(folder / "trace.jsonl"))
    command = [sys.executable, "-c", PROGRAM.read_text()]  # -c: a spawned child does not re-run the program
    if shim == "cli":
        command = [sys.executable, "-m", "shim", "--trace", str(folder / "trace.jsonl")] + command
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(REPO))


def _result(proc, folder) -> dict:
    """The program's ``R``, its trace records, the stand-in's events and its stderr."""
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{stdout}\nSTDERR:\n{stderr}"

    def lines(path):
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    return {"R": json.loads(stdout.strip().splitlines()[-1]), "trace": lines(folder / "trace.jsonl"),
            "events": lines(folder / "events.jsonl"), "stderr": stderr}


@pytest.fixture(scope="module")
def all_runs(model_dir, tmp_path_factory):
    """``(on, off, auto)``, run at the same time. Shim on (``python -m shim``): engines spawned and forked, B
    (no sleep mode, forked), the in-process LLM. Shim off: the forked engine A, B and the in-process LLM.
    ``import shim.auto`` in the program: a bare child spawned with the PYTHONPATH the import found and one with
    the PYTHONPATH it left, then engine A spawned."""
    on_dir, off_dir, auto_dir = (tmp_path_factory.mktemp(n) for n in ("on", "off", "auto"))
    on = _start(model_dir, on_dir, "cli", "spawn,fork,nosleep-fork", True)
    off = _start(model_dir, off_dir, None, "fork,nosleep-fork", True)
    auto = _start(model_dir, auto_dir, "auto", "spawn", False)
    return _result(on, on_dir), _result(off, off_dir), _result(auto, auto_dir)


@pytest.fixture(scope="module")
def runs(all_runs):
    return all_runs[:2]


def _sleeps(run, pid):
    return [r for r in run["trace"] if r["event"] == "sleep" and r["pid"] == pid]


def _worker_sleeps(run, pid):
    return [e for e in run["events"] if e["event"] == "worker_sleep" and e["pid"] == pid]


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_async_llm_sleep_checked_in_engine_core(runs, method):
    on, off = runs
    core, parent = on["R"]["core"][method], on["R"]["parent"]
    assert core != parent

    # shim off: ms-swift #6636 in the engine core (nothing in the pool, the sleep frees ~0), and nobody says so
    assert off["trace"] == [] and "[shim]" not in off["stderr"]
    freed_off = _worker_sleeps(off, off["R"]["core"]["fork"])
    assert len(freed_off) == 2 and all(e["freed_bytes"] < GiB and e["pool_bytes"] == 0 for e in freed_off)

    # shim on: the guard ran in the engine core (the pool got the memory, the sleep frees it) ...
    freed_on = _worker_sleeps(on, core)
    assert len(freed_on) == 2 and all(e["freed_bytes"] >= 0.9 * e["pool_bytes"] > 10 * GiB for e in freed_on)
    # ... and the check too: one record per sleep, from the engine core's pid, the worker's figures
    sleeps = _sleeps(on, core)
    assert len(sleeps) == 2, on["trace"]
    assert all(r["engine"].startswith("Worker#") and r["effective"] is True and r["ppid"] == parent
               for r in sleeps)
    assert sleeps[0]["measured"] == "device" and sleeps[0]["freed"] >= 0.9 * sleeps[0]["tracked"] > 10 * GiB
    if method == "spawn":  # reached through the bootstrap on PYTHONPATH: the child activated itself
        assert any(r["event"] == "activate" and r["pid"] == core and r["ppid"] == parent for r in on["trace"])


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_wake_of_both_tags_after_the_weights_reaches_the_engine_core(runs, method):
    """``wake_up(["weights"])`` then ``wake_up(["weights", "kv_cache"])`` on an ``AsyncLLM``: vLLM's executor
    drops the second (weights is awake), the KV cache stays unmapped and 0.24's engine core never resumes its
    scheduler (the stand-in raises where vLLM would wait forever). The shim passes ["kv_cache"] in the core."""
    on, off = runs
    core = on["R"]["core"][method]
    dropped = [e for e in off["events"] if e["event"] == "executor_guard" and e["what"] == "wake_up"]
    assert [e["pid"] for e in dropped] == [off["R"]["core"]["fork"]], off["events"]
    assert "sleeping" in off["R"]["after"]["fork"], off["R"]
    assert on["R"]["after"][method] == on["R"]["tokens"]
    assert not [e for e in on["events"] if e["event"] == "executor_guard" and e["pid"] == core]
    wakes = [r for r in on["trace"] if r["event"] == "wake" and r["pid"] == core]
    assert [r["tags"] for r in wakes[-2:]] == [["weights"], ["kv_cache"]], wakes


def test_ineffective_sleep_in_engine_core_warns(runs):
    """Engine B, built without sleep mode: its sleep frees nothing. The WARNING comes from its engine
    core (shim on), and is absent without the shim."""
    on_fork, off = runs
    assert "ineffective sleep" not in off["stderr"]
    assert _worker_sleeps(off, off["R"]["core"]["nosleep-fork"])[0]["freed_bytes"] == 0
    (rec,) = _sleeps(on_fork, on_fork["R"]["core"]["nosleep-fork"])
    assert rec["effective"] is False and rec["engine"].startswith("Worker#")
    warnings = [line for line in on_fork["stderr"].splitlines() if "WARNING ineffective sleep Worker#" in line]
    assert len(warnings) == 1 and "built without enable_sleep_mode" in warnings[0], on_fork["stderr"]


def test_in_process_llm_one_record_per_sleep(runs):
    """TRL / ms-swift colocate: the engine's check acts, the worker's in the same process passes through."""
    on_fork, off = runs
    parent = on_fork["R"]["parent"]
    assert _sleeps(off, off["R"]["parent"]) == []
    assert len(_worker_sleeps(on_fork, parent)) == 2  # two sleeps of the in-process worker
    sleeps = _sleeps(on_fork, parent)
    assert [r["engine"].split("#")[0] for r in sleeps] == ["LLMEngine", "LLMEngine"], sleeps
    assert all(r["effective"] for r in sleeps)
    wakes = [r for r in on_fork["trace"] if r["event"] == "wake" and r["pid"] == parent]
    assert len(wakes) == 2


def test_import_shim_auto_reaches_a_spawned_engine_core(all_runs):
    """``import shim.auto`` alone (no ``python -m shim``), ``VLLM_WORKER_MULTIPROC_METHOD=spawn``: the engine
    core is a new interpreter. A spawned child with the PYTHONPATH the import found (what the shim left before it
    reached children) never activates; with the bootstrap directory the import put first on it, it does, and the
    spawned engine core's worker records its sleeps from the core's pid."""
    auto = all_runs[2]
    assert auto["R"]["spawned_active"] == {"before": False, "after": True}
    parent, core = auto["R"]["parent"], auto["R"]["core"]["spawn"]
    assert any(r["event"] == "activate" and r["pid"] == core and r["ppid"] == parent for r in auto["trace"])
    sleeps = _sleeps(auto, core)
    assert len(sleeps) == 2 and all(r["engine"].startswith("Worker#") and r["effective"] for r in sleeps), auto["trace"]
    assert auto["R"]["after"]["spawn"] == auto["R"]["tokens"]


def test_report_groups_engine_cores_under_the_run(runs):
    """Trainer (rank 0) and its engine-core processes (rank 0 too, RANK unset): one run, not four."""
    from shim.observe import tracefile

    on_fork = runs[0]
    trace = tracefile.Trace()
    trace.activations = [r for r in on_fork["trace"] if r["event"] == "activate"]
    trace.records = sorted((r for r in on_fork["trace"] if r["event"] != "activate"), key=lambda r: r["t"])
    groups = tracefile.runs(trace)
    assert len(groups) == 1
    r = on_fork["R"]
    assert sorted(p["pid"] for p in groups[0]) == sorted([r["parent"], *r["core"].values()])
