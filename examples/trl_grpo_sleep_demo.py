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

Ends with a verdict (exit 0 when the shim's run sampled every rollout from the
trained weights, 1 when it did not) and the commands that show ``doctor`` and
``status`` for the TRL and stand-in the demo ran.

``SHIM_TRACE=PATH``: the shim's run appends its sleep/wake events to PATH (read it
with ``vllm-sleep-shim report PATH``); the runs without the shim write nothing.
Other ``SHIM_*`` switches reach the shim's run only, e.g. ``SHIM_DISABLED=1`` (that
run shows the bug again) or ``SHIM_DISABLED_PATCHES=trl-stale-weights`` (which fix it was).
"""
import argparse
import os
import shlex
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from shim.cli import common  # noqa: E402
from shim.engine import config  # noqa: E402
from tests.support.envs import trl_path  # noqa: E402
from tests.support.trl_support import fake_site, run_trl, vllm_for  # noqa: E402

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
            env = None
            if "--shim" in extra:  # the user's switches (SHIM_DISABLED, ...) reach the shim's run only
                env = {k: v for k, v in os.environ.items() if k.startswith("SHIM_") and k != config.SHIM_TRACE}
                env.update({config.SHIM_TRACE: trace} if trace else {})
            result = run_trl(args.trl, os.path.join(tmp, label.replace(" ", "_")), "--steps", str(args.steps), *extra,
                             env=env)
            good = sum(1 for g in result["generates"] if g["engine"] == g["trainer"])
            rows.append((label, after_first(result, "sampling/sampling_logp_difference/mean"),
                         after_first(result, "reward"), good, len(result["generates"])))
    print(f"\nTRL {args.trl} GRPOTrainer, colocate, {args.steps} steps (metrics averaged over steps 2..{args.steps})\n")
    print(f"{'run':<18}{'logp difference':>18}{'reward':>10}{'rollouts on trained weights':>30}")
    for label, logp, reward, good, total in rows:
        print(f"{label:<18}{logp:>18.3g}{reward:>10.3f}{f'{good}/{total}':>30}")
    print()
    for name, meaning in COLUMNS:
        print(f"{name}: {meaning}")
    launcher = launcher_command()
    if trace:
        print(f"\nsleep/wake trace of the shim's run: {trace} ({launcher} report {shlex.quote(trace)})")
    fixed = verdict(args.trl, rows)
    print(f"\nWhat the shim decided for this TRL (TRL {args.trl} from {trl_path(args.trl)}, vLLM: the CPU stand-in "
          f"imitating {vllm_for(args.trl)}); run from any directory:")
    for command in inspect_commands(args.trl, launcher):
        print(f"  {command}")
    print("(doctor: which known bugs this TRL and vLLM have and the fix for each; status --import: each patch's "
          "decision once TRL and vLLM are imported)")
    return 0 if fixed else 1


def verdict(trl: str, rows) -> bool:
    """Print what the table shows; True when the shim's run sampled every rollout from the trained weights."""
    by_label = {label: (good, total) for label, _logp, _reward, good, total in rows}
    good, total = by_label["sleep on"]
    if good < total:
        print(f"\nverdict: without the shim, TRL {trl} with sleep mode on sampled {total - good} of {total} rollouts "
              f"from stale weights (huggingface/trl#5312);", end=" ")
    else:
        print(f"\nverdict: TRL {trl} with sleep mode on sampled every rollout from the trained weights (no #5312 in "
              f"this release);", end=" ")
    good, total = by_label["sleep on + shim"]
    switches = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                        if k.startswith("SHIM_") and k != config.SHIM_TRACE)
    if good == total:
        print(f"with the shim {good}/{total}.")
        return True
    print(f"with the shim only {good}/{total}: NOT fixed" + (f" (switches set: {switches})" if switches else "") + ".")
    return False


def launcher_command() -> str:
    """How to call the launcher from here: ``vllm-sleep-shim`` when it is on PATH, else the console script next
    to this interpreter, else this interpreter with ``-m shim`` (the same launcher)."""
    if shutil.which("vllm-sleep-shim"):
        return "vllm-sleep-shim"
    beside = os.path.join(os.path.dirname(sys.executable), "vllm-sleep-shim")
    if os.access(beside, os.X_OK):
        return shlex.quote(beside)
    return f"{shlex.quote(sys.executable)} -m shim"


def inspect_commands(trl: str, launcher: str) -> list:
    """``doctor`` and ``status --import`` with the TRL release and the vLLM stand-in this demo ran on PYTHONPATH."""
    vllm = vllm_for(trl)
    path = os.pathsep.join([str(trl_path(trl)), fake_site(vllm), REPO])
    prefix = f"PYTHONPATH={shlex.quote(path)} FAKEVLLM_VERSION={vllm} {launcher}"
    return [f"{prefix} {shlex.quote(sys.executable)} -m shim doctor", f"{prefix} status --import"]


if __name__ == "__main__":
    sys.exit(main())
