"""TRL #5312 on a real GPU: GRPOTrainer + colocated vLLM, sleep mode off / on / on + shim.

    python examples/trl_grpo_colocate.py [--trl-path DIR] [--size tiny|wide] [--steps 6] [--lr 3e-3]

Needs an NVIDIA GPU, vLLM and TRL (the TRL installed here, or the release in
``--trl-path DIR``, e.g. made by ``pip install --no-deps --target DIR trl==1.9.2``).
Makes a random Qwen2 locally (no hub access), then runs TRL's GRPOTrainer three
times with ``use_vllm=True, vllm_mode="colocate"``: sleep mode off, sleep mode on,
and sleep mode on with ``import shim.auto`` first, one after the other (each
vLLM engine gets a fixed KV cache); about a minute on an H200 with the tiny model.

It prints TRL's own ``sampling/sampling_logp_difference/mean`` (how far the
rollout engine's log-probs are from the trainer's: ~0 when vLLM samples from
the trained weights) per step, the reward, and at how many rollouts the vLLM
engine held the trainer's current weights (compared parameter by parameter right
before vLLM samples), then a verdict: exit 0 when every run finished and the shim's
run sampled every rollout from the trained weights, else 1. The CPU version of this
demo is examples/trl_grpo_sleep_demo.py; CI also runs this file on the CPU stand-in
(``--pythonpath tests/fakevllm --trl-path .envs/trl-1.9.2 --steps 2``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.gpu import common  # noqa: E402
from tests.gpu import runs as R

LOGP = "sampling/sampling_logp_difference/mean"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trl-path", default="", help="folder holding the TRL release to run (default: installed trl)")
    p.add_argument("--size", default="tiny", choices=sorted(common.SIZES))
    p.add_argument("--model", default="", help="model folder to use or make (default: in --workdir)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--workdir", default="", help="where runs write (default: a temporary folder)")
    p.add_argument("--parallel", action="store_true", help="the three runs on the GPU at once (fragile)")
    p.add_argument("--pythonpath", action="append", default=[],
                   help="put DIR first on the runs' PYTHONPATH (tests/fakevllm: the CPU stand-in of vLLM, no GPU)")
    a = p.parse_args(argv)
    reason = common.skip_reason()
    if reason and not a.pythonpath:
        print(f"this example needs a GPU with vLLM: {reason} (examples/trl_grpo_sleep_demo.py runs on CPU)")
        return 2
    work = a.workdir or tempfile.mkdtemp(prefix="trl_grpo_colocate-")
    model = common.ensure_model(a.model, work, a.size)
    print(f"model: random Qwen2 ({common.model_info(model).get('size', '?')}) in {model}", file=sys.stderr, flush=True)
    version = "x" if a.trl_path else ""
    runs = [R.Run("sleep off", version, sleep="off"), R.Run("sleep on", version, sleep="on"),
            R.Run("sleep on + shim", version, sleep="on", shim="on")]
    engine_kw = {"kv_cache_memory_bytes": (256 << 20) if a.size == "tiny" else (4 << 30), "enforce_eager": True}
    print(f"running {len(runs)} GRPO runs ({a.steps} steps each) ...", file=sys.stderr, flush=True)
    results = R.run_all(runs, model, work, trl={"x": a.trl_path}, pythonpath=a.pythonpath,
                        parallel=a.parallel,
                        common_args=["--steps", a.steps, "--lr", a.lr, "--observe", "--engine-kw", json.dumps(engine_kw)])
    trl_version = next((r["trl"] for r in results.values() if r.get("trl")), "?")
    print(f"\nTRL {trl_version} GRPOTrainer, vLLM colocate, {a.steps} steps, lr {a.lr}, model {a.size}\n")
    print(f"{'run':<18}{'logp difference, steps 2-%d (mean)' % a.steps:>36}{'reward':>10}"
          f"{'rollouts on trained weights':>30}")
    for run in runs:
        r = results[run.label]
        if not r.get("metrics"):
            print(f"{run.label:<18}  failed: {r.get('error', r.get('skipped'))}")
            continue
        series = [m.get(LOGP) for m in r["metrics"] if LOGP in m]
        logp = R.mean_after_first(series)
        print(f"{run.label:<18}{logp if logp is None else format(logp, '.3g'):>36}"
              f"{r['metrics'][-1].get('reward', float('nan')):>10.3f}"
              f"{str(r['rollouts_on_trainer_weights']) + '/' + str(r['rollouts']):>30}")
    print("\nper step:")
    for run in runs:
        series = [m.get(LOGP) for m in (results[run.label].get("metrics") or []) if LOGP in m]
        print(f"  {run.label:<18}" + " ".join(f"{x:.3g}" for x in series))
    print(f"\nraw records: {work}/*.json")
    if not all(r.get("metrics") for r in results.values()):
        return 1
    shim = results["sleep on + shim"]
    good, total = shim["rollouts_on_trainer_weights"], shim["rollouts"]
    print(f"verdict: with the shim {good}/{total} rollouts on the trained weights"
          + ("" if good == total else ": NOT fixed"))
    return 0 if good == total else 1


if __name__ == "__main__":
    sys.exit(main())
