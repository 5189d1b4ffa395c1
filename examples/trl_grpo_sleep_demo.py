"""TRL #5312 on your CPU: a real TRL 1.9.2 GRPOTrainer, with vLLM sleep mode off, on, and on + shim.

    python examples/trl_grpo_sleep_demo.py [--trl 1.9.2] [--steps 4]

The vLLM engine is the repository's CPU stand-in (tests/fakevllm: it runs a tiny
real model and mirrors vLLM's sleep levels, tags and reload_weights); TRL is the
real release, installed on first use into .envs/ (pip, no dependencies). Prints
TRL's own ``sampling/sampling_logp_difference/mean`` (how far the rollout
engine's log-probs are from the trainer's: ~0 when vLLM samples from the
trained weights) and the reward, averaged over the steps after the first, and
how many rollouts used the trainer's current weights (each column is explained
under the table).

``SHIM_TRACE=PATH``: the shim's run appends its sleep/wake events to PATH (read it
with ``python -m shim report PATH``); the runs without the shim write nothing.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shim.cli import common
from shim.engine import config
from tests.support.trl_support import run_trl  # noqa: E402

COLUMNS = (
    ("logp difference", "TRL's sampling/sampling_logp_difference/mean, mean |log p(vLLM) - log p(trainer)| per "
                        "sampled token: good is ~0 (here < 0.001 in float32; 0.001-0.02 in bf16 on a GPU); above "
                        "0.05 for 2 logging steps the shim warns 'stale rollouts?'"),
    ("reward", "mean reward (completion length / 10); a few steps on a tiny model show no trend, it is here "
               "because a flat reward is how #5312 looks in a real run"),
    ("rollouts on trained weights", "generates whose engine weights equal the trainer's current weights, "
                                    "checked by fingerprint right before vLLM samples (all of them is right)"),
)


def after_first(result, key):
    values = [m[key] for m in result["metrics"] if key in m and m["step"] >= 2]
    return sum(values) / len(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl", default="1.9.2", help="TRL release to run (default 1.9.2)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    trace, error = common.check_trace_path(os.environ.get(config.SHIM_TRACE, ""), option=config.SHIM_TRACE)
    if error:
        print(error, file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in (("sleep off", ["--sleep", "off"]), ("sleep on", ["--sleep", "on"]),
                             ("sleep on + shim", ["--sleep", "on", "--shim", "before"])):
            print(f"running: {label} ...", file=sys.stderr, flush=True)
            env = {config.SHIM_TRACE: trace} if trace and "--shim" in extra else None
            result = run_trl(args.trl, os.path.join(tmp, label.replace(" ", "_")), "--steps", str(args.steps), *extra,
                             env=env)
            good = sum(1 for g in result["generates"] if g["engine"] == g["trainer"])
            rows.append((label, after_first(result, "sampling/sampling_logp_difference/mean"),
                         after_first(result, "reward"), f"{good}/{len(result['generates'])}"))
    print(f"\nTRL {args.trl} GRPOTrainer, colocate, {args.steps} steps (metrics averaged over steps 2..{args.steps})\n")
    print(f"{'run':<18}{'logp difference':>18}{'reward':>10}{'rollouts on trained weights':>30}")
    for label, logp, reward, good in rows:
        print(f"{label:<18}{logp:>18.3g}{reward:>10.3f}{good:>30}")
    print()
    for name, meaning in COLUMNS:
        print(f"{name}: {meaning}")
    if trace:
        print(f"\nsleep/wake trace of the shim's run: {trace} (python -m shim report {trace})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
