"""What the shim costs a real GRPO step: TRL 1.9.2 + shim against TRL 1.10.0 and against sleep off.

    python bench/gpu_step_cost.py --trl-path 1.9.2=/tmp/trl-1.9.2 --trl-path 1.10.0=/tmp/trl-1.10.0
        [--steps 8] [--workdir /tmp/shim-gpu/cost] [--out bench/results/gpu_step_cost.json]

Needs CUDA and real vLLM. A wide random Qwen2 (~1.1 B parameters, 2.1 GiB of
bf16 weights) made locally; three runs, one at a time (their imports overlap,
their GPU work does not), same seeds and batch:

    TRL 1.9.2  sleep on + shim   (SHIM_TRACE on: the per-rank trace and its plot come from this run)
    TRL 1.10.0 sleep on          (the upstream fix: goal, shim/upstream <= 1.0)
    TRL 1.9.2  sleep off

Seconds per GRPO step: the median (and mean) of the steps after the first (the
first compiles kernels and fills caches); ratios use the median. Also per run: the engine's sleep / wake
seconds as TRL drives them (level 2; ``wake_up(["weights"])``, then
``["kv_cache"]``), the weight pushes, and the engine's construction. With a
trace, ``python -m shim report TRACE --plot PNG`` is run on it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402
from tests.gpu import runs as R

GUARD_PATCHES = "vllm-sleep-guard,vllm-sleep-check,vllm-llm-sleep-check"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl-path", action="append", default=[], metavar="VERSION=DIR")
    p.add_argument("--pythonpath", action="append", default=[])
    p.add_argument("--workdir", default="/tmp/shim-gpu/cost")
    p.add_argument("--model", default="", help="model folder (default: WORKDIR/wide, made if missing)")
    p.add_argument("--size", default="wide", choices=sorted(common.SIZES))
    p.add_argument("--out", default=str(common.RESULTS_DIR / "gpu_step_cost.json"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-6, help="small: a 1 B random model at 3e-3 diverges")
    p.add_argument("--gpu-util", type=float, default=0.3, help="vllm_gpu_memory_utilization (TRL's default)")
    p.add_argument("--no-eager", action="store_true", help="let vLLM compile and capture CUDA graphs")
    p.add_argument("--with-bug", action="store_true", help="also TRL 1.9.2 sleep on without the shim")
    p.add_argument("--with-trl-only", action="store_true",
                   help="also TRL 1.9.2 + shim with only the TRL patch (the vLLM guard patches disabled)")
    p.add_argument("--after", nargs="*", default=[])
    p.add_argument("--done", default="")
    p.add_argument("--plot", default="", help="PNG of the trace (default WORKDIR/sleep_trace.png)")
    p.add_argument("--timeout", type=float, default=900.0)
    return p.parse_args(argv)


def report(trace: str, png: str) -> dict:
    """``python -m shim report TRACE --plot PNG``; its output and exit status."""
    if not trace or not os.path.exists(trace) or os.path.getsize(trace) == 0:
        return {"skipped": "no trace written (no vLLM guard events)"}
    proc = subprocess.run([sys.executable, "-m", "shim", "report", trace, "--plot", png], cwd=str(common.REPO),
                          capture_output=True, text=True, timeout=120)
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-2000:], "png": png,
            "png_written": os.path.exists(png)}


def main(argv=None) -> int:
    a = parse(argv)
    os.makedirs(a.workdir, exist_ok=True)
    model = common.ensure_model(a.model, a.workdir, a.size)
    trace = os.path.join(a.workdir, "grpo_trace.jsonl")
    if os.path.exists(trace):
        os.unlink(trace)
    runs = [R.Run("1.9.2 sleep on + shim", "1.9.2", sleep="on", shim="on", trace=trace),
            R.Run("1.10.0 sleep on", "1.10.0", sleep="on"),
            R.Run("1.9.2 sleep off", "1.9.2", sleep="off")]
    if a.with_trl_only:
        runs.append(R.Run("1.9.2 sleep on + shim (TRL patch only)", "1.9.2", sleep="on", shim="on",
                          env={"SHIM_DISABLED_PATCHES": GUARD_PATCHES}))
    if a.with_bug:
        runs.append(R.Run("1.9.2 sleep on", "1.9.2", sleep="on"))
    engine_kw = {"enforce_eager": not a.no_eager}
    results = R.run_all(runs, model, a.workdir, trl=R.trl_paths(a.trl_path), pythonpath=a.pythonpath,
                        parallel=False, after=a.after, done_marker=a.done or None, timeout=a.timeout,
                        common_args=["--steps", a.steps, "--lr", a.lr, "--gpu-util", a.gpu_util,
                                     "--engine-kw", json.dumps(engine_kw)], need_s=150)

    def step(label):  # median of the steps after the first: robust to a slow step
        return (results.get(label) or {}).get("step_s_median_after_first")

    shim_s, up_s, off_s = step("1.9.2 sleep on + shim"), step("1.10.0 sleep on"), step("1.9.2 sleep off")
    trl_only_s = step("1.9.2 sleep on + shim (TRL patch only)")
    ratios = {
        "shim_1.9.2_over_1.10.0": shim_s / up_s if shim_s and up_s else None,
        "shim_trl_patch_only_over_1.10.0": trl_only_s / up_s if trl_only_s and up_s else None,
        "shim_1.9.2_over_sleep_off": shim_s / off_s if shim_s and off_s else None,
        "1.10.0_over_sleep_off": up_s / off_s if up_s and off_s else None,
    }
    rows = []
    for run in runs:
        r = results.get(run.label) or {}
        sw = r.get("sleep_wake_mean_s") or {}
        rows.append({"run": f"TRL {run.label}", "s/step (median 2-%d)" % a.steps: r.get("step_s_median_after_first"),
                     "s/step (mean)": r.get("step_s_mean_after_first"),
                     "sleep L2 s": sw.get("sleep_l2"), "wake weights s": sw.get("wake_weights"),
                     "wake kv_cache s": sw.get("wake_kv_cache"),
                     "push s": (sum(r["push_s"]) / len(r["push_s"])) if r.get("push_s") else None,
                     "pushes": r.get("pushes"), "engine init s": (r.get("engine_init") or {}).get("seconds"),
                     "status": r.get("skipped") or ("ok" if r.get("metrics") else "failed")})
    cols = ["run", "s/step (median 2-%d)" % a.steps, "s/step (mean)", "sleep L2 s", "wake weights s", "wake kv_cache s", "push s",
            "pushes", "engine init s", "status"]
    md = common.fmt_table(rows, cols)
    rep = report(trace, a.plot or os.path.join(a.workdir, "sleep_trace.png"))
    record = {"what": "seconds per GRPO step and sleep/wake as TRL drives them (issue 7, item 2)",
              "model": common.model_info(model), "steps": a.steps, "lr": a.lr, "engine_kw": engine_kw,
              "gpu_util": a.gpu_util, "ratios": ratios, "table_md": md, "trace": trace, "report": rep,
              "runs": results}
    extra = ("python -m shim report:\n" + rep["stdout"]) if rep.get("stdout") else (f"report: {rep}" if rep else "")
    return common.publish(a.out, record, results, md, ratios, extra)


if __name__ == "__main__":
    sys.exit(main())
