"""ms-swift 4.6.0 GRPO (colocate, sleep levels 1/2, full/LoRA, with and without ``python -m shim``) and GKD.

    python bench/gpu_swift.py --model DIR --teacher DIR --workdir W --out-grpo G.json --out-gkd K.json
        [--phases grpo,gkd] [--levels 1,2] [--tuners full,lora] [--steps 4] [--python PY] [--cpu-dry-run]

Every run is ms-swift's own CLI, one after the other on the GPU, ``NPROC_PER_NODE=1`` (the launcher
starts torchrun, torchrun the rank):

    without the shim:  PY -m swift.cli.main rlhf ARGS
    with the shim:     PY -m shim --trace T.jsonl PY -m swift.cli.main rlhf ARGS

(``python -m swift.cli.main`` is the ``swift`` console script's code; ``pip --target`` may not
install the script). Offline: ``MODELSCOPE_OFFLINE=1``, local model folders (tests.gpu.common.make_model),
local jsonl datasets written here, ``--model_type qwen2 --template qwen2_5``, the reward ``shim_len``
and the observation of tests/gpu/swift_plugin.py through ``--external_plugins`` (engine vs trainer
weights before every rollout, each worker sleep's freed share, allocator strings, s/step), with the
user's ``PYTORCH_CUDA_ALLOC_CONF`` set to ``--alloc-conf`` for every run.

GRPO: ``--levels`` x ``--tuners`` x (shim off, on); LoRA is ``--tuner_type lora --vllm_enable_lora
true`` (4.6.0 pushes the full weights after a level-2 sleep, then the adapter). GKD (through the shim,
and once without it): student ``--deepspeed zero2``, teacher ``--teacher_deepspeed zero3`` (the same
tiny architecture, other random weights), on-policy (``--lmbda 1``) with vLLM colocated at sleep level 1.
A run is skipped (and says so) when it cannot finish before ``SHIM_GPU_DEADLINE``.

``--cpu-dry-run``: the same commands on CPU with tests/fakevllm as vLLM (float32, gloo, deepspeed's CPU
accelerator), to debug this script and the plugin before GPU time is spent.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402

PLUGIN = common.REPO / "tests" / "gpu" / "swift_plugin.py"
FAKEVLLM = common.REPO / "tests" / "fakevllm"
USER_ALLOC = "max_split_size_mb:512,expandable_segments:False"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="student / policy model folder")
    p.add_argument("--teacher", default="", help="GKD teacher folder (phase gkd)")
    p.add_argument("--workdir", required=True)
    p.add_argument("--out-grpo", default="")
    p.add_argument("--out-gkd", default="")
    p.add_argument("--phases", default="grpo,gkd")
    p.add_argument("--levels", default="1,2")
    p.add_argument("--tuners", default="full,lora")
    p.add_argument("--shims", default="off,on", help="which of off,on to run for GRPO")
    p.add_argument("--gkd-shims", default="on,off", help="which of on,off to run for GKD")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--gkd-steps", type=int, default=3)
    p.add_argument("--gpu-util", type=float, default=0.1)
    p.add_argument("--alloc-conf", default=USER_ALLOC, help="the user's PYTORCH_CUDA_ALLOC_CONF for every run")
    p.add_argument("--python", default=sys.executable, help="interpreter with ms-swift (and vLLM) importable")
    p.add_argument("--need-s", type=float, default=75.0, help="seconds one run needs (deadline check)")
    p.add_argument("--run-timeout", type=float, default=240.0)
    p.add_argument("--cpu-dry-run", action="store_true")
    a = p.parse_args(argv)
    a.levels = [int(x) for x in a.levels.split(",") if x]
    a.tuners = [x for x in a.tuners.split(",") if x]
    a.shims = [x for x in a.shims.split(",") if x]
    a.gkd_shims = [x for x in a.gkd_shims.split(",") if x]
    a.phases = [x for x in a.phases.split(",") if x]
    bad = [x for x in a.levels if x not in (1, 2)] + [x for x in a.tuners if x not in ("full", "lora")] + \
        [x for x in a.shims + a.gkd_shims if x not in ("on", "off")] + [x for x in a.phases if x not in ("grpo", "gkd")]
    if bad:
        p.error(f"unknown values {bad} (levels 1,2; tuners full,lora; shims on,off; phases grpo,gkd)")
    if "gkd" in a.phases and not a.teacher:
        p.error("phase gkd needs --teacher DIR")
    return a


def write_data(workdir: pathlib.Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    grpo, gkd = workdir / "grpo.jsonl", workdir / "gkd.jsonl"
    with open(grpo, "w") as f:
        for i in range(64):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i} + {i % 7} ="}]}) + "\n")
    with open(gkd, "w") as f:
        for i in range(64):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"{i} + {i % 7} ="},
                                             {"role": "assistant", "content": str(i + i % 7)}]}) + "\n")
    return {"grpo": str(grpo), "gkd": str(gkd)}


def base_env(a, obs: str, model: str) -> dict:
    env = dict(os.environ)
    for k in ("SHIM_TRACE", "SHIM_DISABLED", "SHIM_DISABLED_PATCHES", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    env.update({"NPROC_PER_NODE": "1", "MASTER_PORT": common.free_port(), "MASTER_ADDR": "127.0.0.1",
                "MODELSCOPE_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true",
                "PYTHONUNBUFFERED": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "MODELSCOPE_CACHE": str(pathlib.Path(a.workdir) / "ms"),
                "PYTORCH_CUDA_ALLOC_CONF": a.alloc_conf,
                "SHIM_SWIFT_OBSERVE": obs, "SHIM_SWIFT_MODEL": model})
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)  # torchrun sets them for the rank
    parts = [str(common.REPO)]
    if a.cpu_dry_run:
        parts.insert(0, str(FAKEVLLM))
        env.update({"FAKEVLLM_VERSION": "0.24.0", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                    "SHIM_SWIFT_CPU_STANDIN": "1"})
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def common_args(a) -> list:
    dtype = "float32" if a.cpu_dry_run else "bfloat16"
    return ["--model_type", "qwen2", "--template", "qwen2_5", "--torch_dtype", dtype,
            "--external_plugins", str(PLUGIN), "--report_to", "none", "--logging_steps", "1",
            "--save_strategy", "no", "--seed", "0", "--dataloader_num_workers", "0", "--split_dataset_ratio", "0",
            "--max_completion_length", "16", "--use_vllm", "true", "--vllm_mode", "colocate",
            "--vllm_gpu_memory_utilization", str(a.gpu_util), "--vllm_max_model_len", "512",
            "--vllm_enforce_eager", "true", "--check_model", "false",
            # CPU: ms-swift turns fp16 mixed precision on for a float32 model; deepspeed's CPU accelerator refuses it
            *(["--fp16", "false", "--bf16", "false"] if a.cpu_dry_run else [])]


def grpo_args(a, data, level, tuner, out_dir) -> list:
    args = ["rlhf", "--rlhf_type", "grpo", "--model", a.model, "--dataset", data["grpo"],
            *common_args(a), "--reward_funcs", "shim_len", "--sleep_level", str(level),
            "--max_steps", str(a.steps), "--per_device_train_batch_size", "8", "--num_generations", "4",
            "--gradient_accumulation_steps", "1", "--beta", "0", "--temperature", "1.0",
            "--output_dir", out_dir]
    if tuner == "lora":
        args += ["--tuner_type", "lora", "--lora_rank", "8", "--lora_alpha", "32", "--target_modules", "all-linear",
                 "--vllm_enable_lora", "true", "--learning_rate", "3e-2"]
    else:
        args += ["--tuner_type", "full", "--learning_rate", "3e-3"]
    return args


def gkd_args(a, data, out_dir) -> list:
    return ["rlhf", "--rlhf_type", "gkd", "--model", a.model, "--teacher_model", a.teacher,
            "--teacher_model_type", "qwen2", "--dataset", data["gkd"], *common_args(a),
            "--deepspeed", "zero2", "--teacher_deepspeed", "zero3", "--lmbda", "1.0", "--beta", "0.5",
            "--sleep_level", "1", "--max_steps", str(a.gkd_steps), "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "1", "--learning_rate", "1e-4", "--tuner_type", "full",
            "--output_dir", out_dir]


def trace_summary(trace: str) -> dict:
    """Per-process activation records and every sleep / wake record of a SHIM_TRACE file."""
    recs = []
    try:
        for line in pathlib.Path(trace).read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        return {"error": f"no trace {trace}"}
    act = [r for r in recs if r.get("event") == "activate"]
    sleeps = [{k: r.get(k) for k in ("level", "tracked", "freed", "effective", "seconds", "shim_s", "note")}
              for r in recs if r.get("event") == "sleep"]
    wakes = [{k: r.get(k) for k in ("tags", "restored", "tracked", "seconds", "shim_s", "note")}
             for r in recs if r.get("event") == "wake"]
    for s in sleeps:
        s["share"] = (s["freed"] / s["tracked"]) if s.get("tracked") else None
    return {"activations": [{k: r.get(k) for k in ("pid", "ppid", "rank", "argv")} for r in act],
            "sleeps": sleeps, "wakes": wakes}


def shim_report(a, trace: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(common.REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([a.python, "-m", "shim", "report", trace], cwd=str(common.REPO), env=env,
                          capture_output=True, text=True, timeout=120)
    return {"rc": proc.returncode, "stdout": proc.stdout[-4000:], "stderr": proc.stderr[-2000:]}


CURRENT: list = []  # the run in progress (its process group is killed on SIGTERM)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _on_term(signum, frame):
    for proc in CURRENT:
        _kill_group(proc)
    sys.exit(128 + signum)


def run_one(a, label: str, swift_argv: list, shim: str, model: str) -> dict:
    work = pathlib.Path(a.workdir)
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", label)
    obs, log, trace = work / f"{slug}.obs.json", work / f"{slug}.log", work / f"{slug}.trace.jsonl"
    for stale in (obs, trace):
        if stale.exists():
            stale.unlink()
    deadline = common.deadline()
    if deadline and time.time() + a.need_s > deadline:
        print(f"[gpu_swift] {label}: skipped (deadline)", flush=True)
        return {"label": label, "skipped": f"deadline ({deadline - time.time():.0f} s left, {a.need_s:.0f} s needed)"}
    env = base_env(a, str(obs), model)
    swift = [a.python, "-m", "swift.cli.main", *swift_argv]
    cmd = [a.python, "-m", "shim", "--trace", str(trace), *swift] if shim == "on" else swift
    timeout = a.run_timeout if not deadline else max(min(a.run_timeout, deadline + 30 - time.time()), 10)
    t = time.time()
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        # own process group: the launcher starts torchrun, torchrun the rank; a timeout (or this script being
        # terminated) must end all of them, or the rank keeps its GPU memory for the next run
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=str(work),
                                start_new_session=True)
        CURRENT[:] = [proc]
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = 124
            f.write(f"\n[gpu_swift] killed after {timeout:.0f} s\n")
        finally:
            CURRENT[:] = []
    result = common.read_json(obs) or {}
    result.update(label=label, shim=shim, cmd=cmd, rc=rc, run_wall_s=time.time() - t, log=str(log))
    if rc != 0 or not result.get("metrics"):
        result["error"] = f"exit {rc}: " + common.tail(log, 25)
    if shim == "on":
        result["trace"] = trace_summary(str(trace))
        result["report"] = shim_report(a, str(trace)) if trace.exists() else {"skipped": "no trace"}
    print(f"[gpu_swift] {label}: rc {rc}, {time.time() - t:.0f} s, "
          f"{sum(1 for g in result.get('rollouts', []) if on_trainer(g))}/{len(result.get('rollouts', []))}"
          f" rollouts on the trainer's weights", flush=True)
    return result


def on_trainer(g: dict) -> bool:
    """The engine sampled from the trainer's weights (LoRA: its base up to the upstream merge/unmerge drift,
    see tests/gpu/swift_plugin.py; the adapter is checked separately)."""
    if "trainer_base_drift" in g:
        return not g.get("unmatched") and g.get("max_abs_diff_trainer", 1.0) <= max(4 * g["trainer_base_drift"], 1e-6)
    return bool(g.get("engine_eq_trainer"))


def rewards(run: dict) -> list:
    return [m.get("reward") for m in run.get("metrics", []) if "reward" in m]


def grpo_table(runs: dict) -> str:
    rows = []
    for label, r in runs.items():
        shares = [s.get("freed_share") for s in r.get("sleep_wake", []) if s.get("op") == "sleep"]
        shares = [x for x in shares if x is not None]
        steps = [m for m in r.get("alloc_at_step", [])]
        rows.append({"run": label, "rc": r.get("rc"), "skipped": r.get("skipped"),
                     "rollouts on trainer weights": f"{sum(1 for g in r.get('rollouts', []) if on_trainer(g))}"
                                                    f"/{len(r.get('rollouts', []))}",
                     "rewards": " / ".join(f"{x:.4g}" for x in rewards(r) if isinstance(x, (int, float))),
                     "min freed share": min(shares) if shares else None,
                     "user alloc kept": (all(s.get("PYTORCH_CUDA_ALLOC_CONF") == r.get("user_alloc", {}).get(
                         "PYTORCH_CUDA_ALLOC_CONF") for s in steps) if steps else None),
                     "LoRA base drift": max([g.get("trainer_base_drift") or 0.0 for g in r.get("rollouts", [])] or [0.0])
                     if "lora" in label else None,
                     "s/step": r.get("step_s_median_after_first")})
    return common.fmt_table(rows, ["run", "rc", "skipped", "rollouts on trainer weights", "rewards", "min freed share",
                                   "user alloc kept", "LoRA base drift", "s/step"])


def main(argv=None) -> int:
    a = parse(argv)
    signal.signal(signal.SIGTERM, _on_term)
    work = pathlib.Path(a.workdir)
    data = write_data(work)
    record_common = {"steps": a.steps, "gkd_steps": a.gkd_steps, "user_alloc_conf": a.alloc_conf,
                     "gpu_util": a.gpu_util, "cpu_dry_run": a.cpu_dry_run, "model": common.model_info(a.model)}
    if "grpo" in a.phases:
        runs = {}
        for tuner in a.tuners:
            for level in a.levels:
                for shim in a.shims:
                    label = f"grpo {tuner} L{level}" + (" + shim" if shim == "on" else "")
                    runs[label] = run_one(a, label, grpo_args(a, data, level, tuner, str(work / "out")), shim, a.model)
        ratios = {}
        for tuner in a.tuners:
            for level in a.levels:
                off, on = runs.get(f"grpo {tuner} L{level}", {}), runs.get(f"grpo {tuner} L{level} + shim", {})
                if off.get("step_s_median_after_first") and on.get("step_s_median_after_first"):
                    ratios[f"{tuner} L{level}"] = on["step_s_median_after_first"] / off["step_s_median_after_first"]
        table = grpo_table(runs)
        if a.out_grpo:
            common.publish(a.out_grpo, {"what": "ms-swift 4.6.0 GRPO colocate via its CLI, NPROC_PER_NODE=1, "
                                                "with and without python -m shim", **record_common,
                                        "runs": runs, "step_ratio_shim_over_off": ratios, "table_md": table},
                           runs, table, {"s/step ratio shim/off " + k: v for k, v in ratios.items()})
    if "gkd" in a.phases:
        runs = {}
        for shim in a.gkd_shims:
            label = "gkd zero2 student, zero3 teacher" + (" + shim" if shim == "on" else "")
            runs[label] = run_one(a, label, gkd_args(a, data, str(work / "out-gkd")), shim, a.model)
        rows = [{"run": k, "rc": r.get("rc"), "skipped": r.get("skipped"),
                 "teacher loaded under ZeRO-3": [x["zero3"] for x in r.get("from_pretrained", [])
                                                 if x["path"].rstrip("/") == a.teacher.rstrip("/")],
                 "ZeRO-3 at train begin": r.get("zero3_at_train_begin"),
                 "teacher patch": (r.get("decisions") or {}).get("swift-gkd-teacher-zero3-4x"),
                 "steps": len(r.get("step_s", []))} for k, r in runs.items()]
        table = common.fmt_table(rows, ["run", "rc", "skipped", "teacher loaded under ZeRO-3", "ZeRO-3 at train begin",
                                        "teacher patch", "steps"])
        if a.out_gkd:
            common.publish(a.out_gkd, {"what": "ms-swift 4.6.0 on-policy GKD via its CLI on one GPU, student "
                                               "--deepspeed zero2, teacher --teacher_deepspeed zero3",
                                       **record_common, "teacher": a.teacher, "runs": runs, "table_md": table},
                           runs, table, {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
