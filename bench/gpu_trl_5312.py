"""huggingface/trl#5312 on a real GPU: TRL GRPOTrainer + colocated vLLM, with and without the shim.

    python bench/gpu_trl_5312.py --trl-path 1.9.2=/tmp/trl-1.9.2 --trl-path 1.10.0=/tmp/trl-1.10.0
        [--steps 6] [--lr 3e-3] [--workdir /tmp/shim-gpu/trl5312] [--out bench/results/gpu_trl_5312.json]

Needs CUDA and real vLLM (see ../shared/gpu/README.md for the offline bundle);
``--pythonpath tests/fakevllm`` runs the same matrix on the CPU stand-in (slow,
for debugging this script). Five runs of 6 GRPO steps on a tiny random Qwen2
made locally, one after the other (imports overlap; ``--parallel`` runs them
together, see tests/gpu/runs.py for why that is fragile); each engine gets a
fixed KV cache (``kv_cache_memory_bytes``) and ``enforce_eager``:

    TRL 1.9.2  sleep off            reference
    TRL 1.9.2  sleep on             #5312: rollouts come from the initial checkpoint
    TRL 1.9.2  sleep on + shim      the fix
    TRL 1.10.0 sleep on             the upstream fix
    TRL 1.10.0 sleep on + shim      the shim stands down

At every rollout the engine's parameters are compared with the trainer's and
with the checkpoint (tests/gpu/grpo_run.py). Prints a Markdown table and the
checks; writes them with versions and every run's raw record to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402
from tests.gpu import runs as R

LOGP = "sampling/sampling_logp_difference/mean"
RUNS = (
    R.Run("1.9.2 sleep off", "1.9.2", sleep="off"),
    R.Run("1.9.2 sleep on", "1.9.2", sleep="on"),
    R.Run("1.9.2 sleep on + shim", "1.9.2", sleep="on", shim="on"),
    R.Run("1.10.0 sleep on", "1.10.0", sleep="on"),
    R.Run("1.10.0 sleep on + shim", "1.10.0", sleep="on", shim="on"),
)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl-path", action="append", default=[], metavar="VERSION=DIR",
                   help="folder holding that TRL release (pip install --no-deps --target DIR trl==VERSION)")
    p.add_argument("--pythonpath", action="append", default=[], help="extra folder first on PYTHONPATH")
    p.add_argument("--workdir", default="/tmp/shim-gpu/trl5312")
    p.add_argument("--model", default="", help="model folder (default: WORKDIR/tiny, made if missing)")
    p.add_argument("--out", default=str(common.RESULTS_DIR / "gpu_trl_5312.json"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--kv-bytes", type=int, default=256 << 20, help="kv_cache_memory_bytes of each engine")
    p.add_argument("--no-eager", action="store_true", help="let vLLM compile and capture CUDA graphs")
    p.add_argument("--parallel", action="store_true", help="all runs on the GPU at once (faster, fragile)")
    p.add_argument("--only", nargs="*", default=[], help="labels of the runs to do (default: all five)")
    p.add_argument("--after", nargs="*", default=[], help="marker files to wait for before using the GPU")
    p.add_argument("--done", default="", help="marker file to write when every run has exited")
    p.add_argument("--timeout", type=float, default=900.0)
    return p.parse_args(argv)


def analyse(results: dict) -> dict:
    """The checks of issue 7, item 1 (None: the run needed is missing)."""
    def get(label):
        r = results.get(label) or {}
        return r if r.get("metrics") else None

    def logp(r):
        return [m.get(LOGP) for m in r["metrics"] if LOGP in m] if r else None

    def all_on_trainer(r):
        return None if r is None else (r["rollouts"] > 0 and r["rollouts_on_trainer_weights"] == r["rollouts"])

    def max_diff(a, b):
        if a is None or b is None or len(a) != len(b) or not a:
            return None
        return max(abs(x - y) for x, y in zip(a, b))

    off, bug, fix = get("1.9.2 sleep off"), get("1.9.2 sleep on"), get("1.9.2 sleep on + shim")
    up, up_shim = get("1.10.0 sleep on"), get("1.10.0 sleep on + shim")
    checks = {
        "shim_1.9.2_every_rollout_on_trainer_weights": all_on_trainer(fix),
        "shim_1.9.2_reload_weights_reaching_vllm": None if fix is None else fix["reload_weights_calls"],
        "shim_1.9.2_decision": None if fix is None else fix["decisions"].get("trl-stale-weights"),
        "no_shim_1.9.2_rollouts_after_step_0_on_checkpoint": None if bug is None else
        f"{bug['rollouts_on_checkpoint_after_training']}/{sum(1 for g in bug['generates'] if g['step'] > 0)}",
        "no_shim_1.9.2_bug_shown": None if bug is None else (
            bug["rollouts_on_checkpoint_after_training"] > 0
            and bug["rollouts_on_checkpoint_after_training"] == sum(1 for g in bug["generates"] if g["step"] > 0)),
        "sleep_off_every_rollout_on_trainer_weights": all_on_trainer(off),
        "trl_1.10.0_every_rollout_on_trainer_weights": all_on_trainer(up),
        "shim_1.10.0_decision": None if up_shim is None else up_shim["decisions"].get("trl-stale-weights"),
        "shim_1.10.0_stands_down": None if up_shim is None else
        str(up_shim["decisions"].get("trl-stale-weights", "")).startswith("stand down"),
        "logp_shim_1.9.2_equals_1.10.0": None if fix is None or up is None else logp(fix) == logp(up),
        "logp_shim_1.10.0_equals_1.10.0": None if up_shim is None or up is None else logp(up_shim) == logp(up),
        "logp_shim_1.9.2_equals_sleep_off": None if fix is None or off is None else logp(fix) == logp(off),
        "logp_max_abs_diff_shim_1.9.2_vs_1.10.0": max_diff(logp(fix), logp(up)),
        "logp_max_abs_diff_shim_1.9.2_vs_sleep_off": max_diff(logp(fix), logp(off)),
    }
    return checks


def table(results: dict, steps: int) -> str:
    rows = []
    for run in RUNS:
        if run.label not in results:
            continue
        r = results[run.label]
        if not r.get("metrics"):
            rows.append({"run": f"TRL {run.label}", "rollouts on trainer weights": r.get("skipped") or "failed"})
            continue
        series = [m.get(LOGP) for m in r["metrics"] if LOGP in m]
        trained = sum(1 for g in r["generates"] if g["step"] > 0)
        rows.append({
            "run": f"TRL {run.label}",
            "logp diff per step": " / ".join(f"{x:.3g}" for x in series),
            "mean steps 2-%d" % steps: R.mean_after_first(series),
            "reward (last)": r["metrics"][-1].get("reward"),
            "rollouts on trainer weights": f"{r['rollouts_on_trainer_weights']}/{r['rollouts']}",
            "on initial checkpoint (after step 0)": f"{r['rollouts_on_checkpoint_after_training']}/{trained}",
            "pushes": r["pushes"],
            "reload_weights": r["reload_weights_calls"],
        })
    cols = ["run", "logp diff per step", "mean steps 2-%d" % steps, "reward (last)", "rollouts on trainer weights",
            "on initial checkpoint (after step 0)", "pushes", "reload_weights"]
    return common.fmt_table(rows, cols)


def main(argv=None) -> int:
    a = parse(argv)
    os.makedirs(a.workdir, exist_ok=True)
    model = common.ensure_model(a.model, a.workdir, "tiny")
    engine_kw = {"kv_cache_memory_bytes": a.kv_bytes, "enforce_eager": not a.no_eager}
    chosen = [r for r in RUNS if not a.only or r.label in a.only]
    results = R.run_all(chosen, model, a.workdir, trl=R.trl_paths(a.trl_path), pythonpath=a.pythonpath,
                        parallel=a.parallel, after=a.after, done_marker=a.done or None, timeout=a.timeout,
                        common_args=["--steps", a.steps, "--lr", a.lr, "--observe", "--engine-kw",
                                     json.dumps(engine_kw)], need_s=120)
    checks = analyse(results)
    md = table(results, a.steps)
    record = {"what": "huggingface/trl#5312 on a real GPU (issue 7, item 1)",
              "model": common.model_info(model), "steps": a.steps, "lr": a.lr, "engine_kw": engine_kw,
              "parallel": a.parallel, "checks": checks, "table_md": md, "runs": results}
    return common.publish(a.out, record, results, md, checks)


if __name__ == "__main__":
    sys.exit(main())
