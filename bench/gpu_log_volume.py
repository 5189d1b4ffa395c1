"""What the shim prints over a real GRPO run: its log lines per level against the steps (issue 12, part 4).

    python bench/gpu_log_volume.py --trl-path 1.9.2=/tmp/trl-1.9.2 [--steps 100] [--model DIR]
        [--workdir /tmp/shim-gpu/logs] [--out bench/results/gpu_log_volume.json]

One TRL 1.9.2 GRPO run with vLLM colocated (sleep on, level 2), ``shim.auto`` and
``SHIM_TRACE``, on the wide random Qwen2 (~1.1 B parameters) for ``--steps`` steps.
Counts the run's ``[shim ...]`` lines by level in its output, the sleep / wake
events in its trace (before the quiet logs each was an INFO line) and the
summary lines. Runs on CPU against tests/fakevllm with ``--pythonpath``, to
debug it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402
from tests.gpu import runs as R

LEVEL = re.compile(r"\[shim[^\]]*\] (DEBUG|INFO|WARNING|ERROR) (.*)$")
DECISION = re.compile(r"^[a-z0-9-]+ \(")  # "<patch id> (<upstream ref>, <release>): applied" and the like


def count(log_path: str) -> dict:
    """``{"INFO": n, ...}``, the summary lines, every INFO/WARNING line's first words (what they are about)."""
    levels: dict = {}
    summaries, kinds = 0, {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = LEVEL.search(line.rstrip("\n"))  # a progress bar without a newline may come first
            if not m:
                continue
            level, text = m.groups()
            levels[level] = levels.get(level, 0) + 1
            if text.startswith("sleep summary"):
                summaries += 1
            if level != "DEBUG":
                kind = "patch decision" if DECISION.match(text) else " ".join(text.split()[:2]).rstrip(":")
                kinds[kind] = kinds.get(kind, 0) + 1
    return {"levels": levels, "summaries": summaries, "kinds": kinds}


def events(trace: str) -> dict:
    out: dict = {}
    if os.path.exists(trace):
        with open(trace, errors="replace") as f:
            for line in f:
                try:
                    ev = json.loads(line).get("event")
                except ValueError:
                    continue
                out[ev] = out.get(ev, 0) + 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl-path", action="append", default=[], metavar="VERSION=DIR")
    p.add_argument("--pythonpath", action="append", default=[])
    p.add_argument("--workdir", default="/tmp/shim-gpu/logs")
    p.add_argument("--model", default="")
    p.add_argument("--size", default="wide", choices=sorted(common.SIZES))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--out", default=str(common.RESULTS_DIR / "gpu_log_volume.json"))
    p.add_argument("--after", nargs="*", default=[])
    p.add_argument("--done", default="")
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    model = common.ensure_model(a.model, a.workdir, a.size)
    trace = os.path.join(a.workdir, "trace.jsonl")
    if os.path.exists(trace):
        os.unlink(trace)
    run = R.Run("1.9.2 sleep on + shim", "1.9.2", sleep="on", shim="on", trace=trace)
    results = R.run_all([run], model, a.workdir, trl=R.trl_paths(a.trl_path), pythonpath=a.pythonpath,
                        parallel=False, after=a.after, done_marker=a.done or None, timeout=a.timeout,
                        common_args=["--steps", a.steps, "--lr", 1e-6, "--gpu-util", 0.3,
                                     "--engine-kw", json.dumps({"enforce_eager": True})],
                        need_s=60 + 2.0 * a.steps)
    r = results.get(run.label) or {}
    logs = count(r["log"]) if r.get("log") and os.path.exists(r["log"]) else {}
    ev = events(trace)
    steps = len(r.get("step_s") or []) or None
    info = (logs.get("levels") or {}).get("INFO", 0) + (logs.get("levels") or {}).get("WARNING", 0)
    routine = ev.get("sleep", 0) + ev.get("wake", 0)
    record = {"what": "the shim's log lines over a GRPO run (issue 12, part 4)", "model": common.model_info(model),
              "steps_asked": a.steps, "steps": steps, "log_levels": logs.get("levels"), "summaries": logs.get("summaries"),
              "info_kinds": logs.get("kinds"), "trace_events": ev, "info_or_warning_lines": info,
              "sleep_wake_events": routine, "status": r.get("skipped") or r.get("error") or "ok",
              "env": common.env_info()}
    print(f"{steps} steps: {info} INFO/WARNING lines from the shim ({logs.get('summaries')} summaries); "
          f"{routine} sleep/wake events in the trace (each was an INFO line before); kinds {logs.get('kinds')}")
    common.write_json(a.out, record)
    if a.done:
        open(a.done, "w").close()
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
