"""TRL GRPO with PEFT LoRA on a real GPU: weight verification and the frozen base (issue 30 items 2, 5).

    python bench/gpu_trl_lora.py --trl-path 1.16.0=/tmp/trl-1.16.0 [--pythonpath /tmp/peft]
        [--steps 6] [--workdir /tmp/shim-gpu/lora] [--out bench/results/gpu_trl_lora.json]

Three runs of TRL 1.16.0 ``GRPOTrainer`` (bf16 tiny Qwen2 wrapped in a PEFT LoRA, rank 4 on q_proj/v_proj,
colocated vLLM, sleep on; tests/gpu/grpo_run.py ``--lora``), one after the other:

    LoRA sleep on               upstream: its in-place merge/unmerge drifts the frozen base
    LoRA sleep on + shim        SHIM_VERIFY_WEIGHTS=1: every rollout verified, the base bit-identical
    LoRA sleep on + shim, drop  the same with every push leaving out layers.1 q_proj: every rollout stale

``--pythonpath tests/fakevllm`` runs the same on the CPU stand-in (for debugging this script).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402
from tests.gpu import runs as R

DROP = "layers.1.self_attn.q_proj"
VERIFY = {"SHIM_VERIFY_WEIGHTS": "1"}
RUNS = (
    R.Run("lora sleep on", "1.16.0", sleep="on", extra=["--lora"]),
    R.Run("lora sleep on + shim", "1.16.0", sleep="on", shim="on", extra=["--lora"], env=VERIFY),
    R.Run("lora sleep on + shim, drop", "1.16.0", sleep="on", shim="on", extra=["--lora", "--drop", DROP], env=VERIFY),
)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl-path", action="append", default=[], metavar="VERSION=DIR")
    p.add_argument("--pythonpath", action="append", default=[], help="extra folder first on PYTHONPATH (peft)")
    p.add_argument("--workdir", default="/tmp/shim-gpu/lora")
    p.add_argument("--model", default="")
    p.add_argument("--out", default=str(common.RESULTS_DIR / "gpu_trl_lora.json"))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--kv-bytes", type=int, default=256 << 20)
    p.add_argument("--after", nargs="*", default=[])
    p.add_argument("--done", default="")
    p.add_argument("--timeout", type=float, default=900.0)
    return p.parse_args(argv)


def analyse(results: dict) -> dict:
    def get(label):
        r = results.get(label) or {}
        return r if r.get("metrics") else None

    off, on, drop = get(RUNS[0].label), get(RUNS[1].label), get(RUNS[2].label)
    v_on, v_drop = (on or {}).get("verify") or {}, (drop or {}).get("verify") or {}
    return {
        "no_shim_base_changed_elements": None if off is None else off["base_changed_elements"],
        "shim_base_changed_elements": None if on is None else on["base_changed_elements"],
        "shim_lora_fix_decision": None if on is None else on["decisions"].get("trl-lora-merge-drift"),
        "shim_verified": v_on.get("verified"), "shim_stale": v_on.get("stale"),
        "shim_unverifiable": v_on.get("unverifiable"), "shim_checks": v_on.get("checks"),
        "shim_check_median_s": v_on.get("median_after_first_s"),
        "drop_tensors_left_out": None if drop is None else drop["dropped_tensors"],
        "drop_stale": v_drop.get("stale"), "drop_verified": v_drop.get("verified"),
        "drop_unverifiable": v_drop.get("unverifiable"), "drop_checks": v_drop.get("checks"),
    }


def table(results: dict) -> str:
    rows = []
    for run in RUNS:
        r = results.get(run.label) or {}
        if not r.get("metrics"):
            rows.append({"run": run.label, "verified / stale / unverifiable": r.get("skipped") or "failed"})
            continue
        v = r.get("verify") or {}
        rows.append({"run": run.label, "base elements changed": r["base_changed_elements"],
                     "verified / stale / unverifiable": f"{v.get('verified', '-')} / {v.get('stale', '-')} / "
                                                        f"{v.get('unverifiable', '-')}" if v else "off",
                     "tensors left out": r["dropped_tensors"], "reward (last)": r["metrics"][-1].get("reward")})
    return common.fmt_table(rows, ["run", "base elements changed", "verified / stale / unverifiable",
                                   "tensors left out", "reward (last)"])


def main(argv=None) -> int:
    a = parse(argv)
    os.makedirs(a.workdir, exist_ok=True)
    model = common.ensure_model(a.model, a.workdir, "tiny")
    engine_kw = {"kv_cache_memory_bytes": a.kv_bytes, "enforce_eager": True}
    results = R.run_all(list(RUNS), model, a.workdir, trl=R.trl_paths(a.trl_path), pythonpath=a.pythonpath,
                        after=a.after, done_marker=a.done or None, timeout=a.timeout,
                        common_args=["--steps", a.steps, "--lr", a.lr, "--engine-kw", json.dumps(engine_kw)],
                        need_s=100)
    checks = analyse(results)
    md = table(results)
    record = {"what": "TRL 1.16.0 GRPO + PEFT LoRA: verification and the frozen base (issue 30 items 2, 5)",
              "model": common.model_info(model), "steps": a.steps, "lr": a.lr, "engine_kw": engine_kw,
              "drop": DROP, "checks": checks, "table_md": md, "runs": results}
    return common.publish(a.out, record, results, md, checks)


if __name__ == "__main__":
    sys.exit(main())
