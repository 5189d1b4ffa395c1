"""examples/: the index names every file (and no missing one), one launcher spelling, and every example that can run
on a CPU runs: ``trl_grpo_colocate.py`` on the vLLM stand-in, ``verl_grpo_colocate.sh`` as far as a CPU goes (its
command line against verl 0.9.1's own config). ``trl_grpo_sleep_demo.py``: tests/unit/test_demo.py."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

from tests.support.helpers import REPO, clean_env, last_json, run_python

EXAMPLES = REPO / "examples"
INDEX = EXAMPLES / "README.md"


def index_rows() -> list:
    """The index table's rows, as lists of cells (header and separator left out)."""
    rows = [line.strip().strip("|").split("|") for line in INDEX.read_text().splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows[1:]]


def test_index_lists_every_example_and_only_those():
    rows = index_rows()
    assert [row[0] for row in rows][:1] == ["TRL"] and {"TRL", "ms-swift", "verl", "OpenRLHF"} <= {r[0] for r in rows}
    linked = [m for row in rows for m in re.findall(r"\]\(([^)]+)\)", row[1])]
    present = sorted(p.name for p in EXAMPLES.iterdir()
                     if p.name != "README.md" and p.name != "__pycache__" and not p.name.startswith("."))
    assert sorted(linked) == present
    for row in rows:
        assert len(row) == 5 and all(row), row  # trainer, file, what it shows, what it needs, CI
    how = INDEX.read_text().split("## How to run each", 1)[1]
    assert all(f"examples/{name}" in how for name in present), "a file without its command under 'How to run each'"


def test_one_launcher_spelling():
    """The examples document commands with the console script pyproject.toml installs, never ``python -m shim``."""
    scripts = re.search(r"\[project\.scripts\]\n(.*?)\n\n", (REPO / "pyproject.toml").read_text(), re.S).group(1)
    assert scripts.split("=")[0].strip() == "vllm-sleep-shim"
    for path in EXAMPLES.iterdir():
        if not path.is_file():
            continue
        text = path.read_text()
        if path.name == "README.md":
            assert text.count("python -m shim") == 1 and "`python -m shim` is the same" in text  # said once
        else:
            assert "python -m shim" not in text, path.name
    for name in ("swift_grpo_colocate_sleep.sh", "swift_gkd_server.sh", "verl_grpo_colocate.sh"):
        launches = [line for line in (EXAMPLES / name).read_text().splitlines() if not line.lstrip().startswith("#")
                    and re.search(r"\b(swift rlhf|verl\.trainer\.main_ppo)\b", line)]
        assert launches and all("vllm-sleep-shim " in line for line in launches), (name, launches)


def test_gpu_example_runs_on_the_stand_in(tmp_path):
    """examples/trl_grpo_colocate.py, its three runs on the CPU stand-in of vLLM: the sleep-on run shows #5312, the
    shim's run has every rollout on the trained weights, exit 0 (a run that does not: exit 1, see the demo's test)."""
    from tests.support.envs import trl_path

    env = clean_env(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "trl_grpo_colocate.py"), "--pythonpath",
                           str(REPO / "tests" / "fakevllm"), "--trl-path", str(trl_path("1.9.2")), "--steps", "2",
                           "--workdir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=600,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    rows = {line[:18].strip(): line[18:].split() for line in lines[header + 1:header + 4]}
    assert rows["sleep off"][-1] == rows["sleep on + shim"][-1] == "2/2" and rows["sleep on"][-1] == "1/2", rows
    assert float(rows["sleep on"][0]) > 0.05 > float(rows["sleep on + shim"][0])  # TRL's logp difference
    assert "verdict: with the shim 2/2 rollouts on the trained weights" in lines


VERL_CHECK = r'''
import dataclasses, json, sys
import yaml
from omegaconf import OmegaConf
import verl
from verl.workers.config.rollout import RolloutConfig

cfg = OmegaConf.load(verl.__path__[0] + "/trainer/config/_generated_ppo_trainer.yaml")  # verl's composed config
OmegaConf.set_struct(cfg, True)
errors = []
for override in json.loads(sys.argv[1]):
    key, _, value = override.partition("=")
    try:  # hydra's override: the key must exist (no '+'), the value is YAML
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=True)
    except Exception as exc:
        errors.append(f"{override}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
r = cfg.actor_rollout_ref.rollout
defaults = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
print(json.dumps({"verl": verl.__version__, "errors": errors, "name": r.name, "free_cache_engine": r.free_cache_engine,
                  "hybrid_engine": cfg.actor_rollout_ref.hybrid_engine, "mode": r.mode,
                  "gpus": cfg.trainer.n_gpus_per_node, "steps": cfg.trainer.total_training_steps,
                  "logger": list(cfg.trainer.logger), "enable_sleep_mode": defaults["enable_sleep_mode"]}))
'''


def test_verl_example_is_a_valid_verl_091_colocated_launch(tmp_path):
    """examples/verl_grpo_colocate.sh needs a GPU to run; on a CPU: DRY_RUN=1 prints its commands, and every override
    is a key of verl 0.9.1's own config (a typo, or a key verl renamed, fails here), with the sleep settings its
    comments describe (colocated vLLM, free_cache_engine, verl's RolloutConfig.enable_sleep_mode default on)."""
    from tests.support.envs import verl_paths

    env = clean_env(DRY_RUN="1", NGPUS="2", STEPS="3", DATA=str(tmp_path / "gsm8k"))
    proc = subprocess.run(["bash", str(EXAMPLES / "verl_grpo_colocate.sh"), "trainer.logger=[console,file]"],
                          capture_output=True, text=True, env=env, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    switches, launch, report = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert switches == ["SHIM_VERIFY_WEIGHTS=1", "SHIM_TRACE=verl_shim_trace.jsonl"]
    assert launch[:4] == ["vllm-sleep-shim", "python3", "-m", "verl.trainer.main_ppo"]
    assert report == ["vllm-sleep-shim", "report", "verl_shim_trace.jsonl"]
    overrides = launch[4:]
    assert f"data.train_files={tmp_path / 'gsm8k' / 'train.parquet'}" in overrides
    child = run_python(VERL_CHECK, path=verl_paths("0.9.1"), argv=[json.dumps(overrides)], timeout=300)
    result = last_json(child)
    assert result.pop("errors") == [] and result == {
        "verl": "0.9.1", "name": "vllm", "free_cache_engine": True, "hybrid_engine": True, "mode": "async",
        "gpus": 2, "steps": 3, "logger": ["console", "file"], "enable_sleep_mode": True}


def test_verl_example_stops_without_its_data(tmp_path):
    proc = subprocess.run(["bash", str(EXAMPLES / "verl_grpo_colocate.sh")], capture_output=True, text=True,
                          env=clean_env(DATA=str(tmp_path / "none")), timeout=60,
                          cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"no {tmp_path / 'none' / 'train.parquet'}: make it with verl's "
                                  f"examples/data_preprocess/gsm8k.py")
