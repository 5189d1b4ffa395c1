"""The shim's figures in the trainer's metrics and the stale-rollout alarm (issue 12, parts 2-3).

- A real TRL 1.9.2 ``GRPOTrainer`` on the vLLM stand-in: ``shim/`` keys in
  ``trainer.state.log_history`` at every logging step; the alarm fires once when the #5312 patch
  is switched off (rollouts from the initial checkpoint: TRL's own logp difference is high,
  asserted) and stays silent with it on; without the shim there are no ``shim/`` keys.
- A real transformers 4.57.6 ``Trainer``: why the hook is ``Trainer.log`` (a callback's on_log
  runs after the record is appended), the keys reach every callback, eval logs stay clean, and an
  error inside the shim's part never stops the trainer's log (``SHIM_STRICT=1`` raises).
- The alarm's rule: threshold (``SHIM_STALE_ALARM``), consecutive steps, once.
"""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

from shim.engine import config
from shim.observe import trainer_metrics
from tests.support.helpers import clean_env, last_json, run_python
from tests.support.trl_support import run_trl

LOGP = "sampling/sampling_logp_difference/mean"


@functools.lru_cache(maxsize=None)
def grpo(shim: str, disabled: str = ""):
    out = tempfile.mkdtemp(prefix=f"metrics-{shim}-{disabled or 'all'}-")
    env = {"SHIM_DISABLED_PATCHES": disabled} if disabled else {}
    return run_trl("1.9.2", out, "--shim", shim, "--steps", "4", env=env)


def step_logs(result):
    return [m for m in result["metrics"] if LOGP in m]


def alarms(result):
    return [msg for level, msg in result["shim_log"] if msg.startswith("stale rollouts?")]


def test_alarm_fires_on_stale_rollouts_trl_1_9_2():
    """#5312 patch off: every rollout after the first step samples from the initial checkpoint."""
    result = grpo("before", "trl-stale-weights")
    logs = step_logs(result)
    assert [m["step"] for m in logs] == [1, 2, 3, 4]
    assert logs[0][LOGP] < 0.05 and all(m[LOGP] > 0.05 for m in logs[1:])  # the bug shows in TRL's own figure
    assert result["from_checkpoint_after_training"] > 0
    found = alarms(result)
    assert len(found) == 1, result["shim_log"]  # one WARNING for the run, not one per step
    level = next(lv for lv, msg in result["shim_log"] if msg.startswith("stale rollouts?"))
    assert level == "WARNING"
    text = found[0]
    assert f"{LOGP} stayed above 0.05 for 2 logging steps in a row" in text and "at step 2" in text
    for words in ("stale or discarded weights", "a shim patch standing down or disabled",
                  "tokenizer or chat-template mismatch", "SHIM_VERIFY_WEIGHTS=1", "python -m shim status",
                  "trl-stale-weights (disabled: listed in SHIM_DISABLED_PATCHES)"):
        assert words in text, words
    assert [m["shim/stale_rollout_alarm"] for m in logs] == [0, 0, 1, 1]


def test_alarm_silent_and_figures_logged_with_the_shim():
    result = grpo("before")
    logs = step_logs(result)
    assert [m["step"] for m in logs] == [1, 2, 3, 4]
    assert all(m[LOGP] < 0.05 for m in logs) and result["mismatches"] == 0
    assert alarms(result) == [] and not [lv for lv, _ in result["shim_log"] if lv == "WARNING"]
    # shim/ keys at every logging step, as the trainer recorded them (state.log_history)
    sleeps = [m["shim/sleeps"] for m in logs]
    assert sleeps == sorted(sleeps) and sleeps[0] >= 2 and sleeps[-1] > sleeps[0]
    assert all(m["shim/ineffective_sleeps"] == 0 for m in logs)
    assert all(m["shim/gib_freed_per_sleep"] > 1 for m in logs)  # the stand-in's pool: tens of GiB
    assert all(m["shim/stale_rollout_alarm"] == 0 for m in logs)
    pushes = [m["shim/weight_pushes"] for m in logs]
    # one push (all tensors, one load_weights event per tensor) before each of the 8 generates
    assert pushes == [2, 4, 6, 8] and len(result["generates"]) == 8
    assert result["load_weights_events"] % pushes[-1] == 0


def test_no_shim_no_shim_keys():
    result = grpo("off")
    assert result["metrics"] and not any(k.startswith("shim/") for m in result["metrics"] for k in m)
    assert alarms(result) == []


# ---------------------------------------------------------------------------
# the hook on a real transformers Trainer
# ---------------------------------------------------------------------------
TRAINER = Path(__file__).parent / "children" / "real_trainer.py"


def run_trainer(**env):
    proc = run_python(TRAINER.read_text(), env=clean_env(**env), check=False)
    return (last_json(proc) if proc.returncode == 0 else None), proc


def test_keys_reach_log_history_and_callbacks_real_trainer():
    out, proc = run_trainer()
    train, evaluation = out["history"]
    # the upstream fact behind the hook: a callback's on_log additions never reach log_history
    assert "callback/added" not in train
    assert train["shim/sleeps"] == 1 and train["shim/ineffective_sleeps"] == 0
    assert train["shim/gib_freed_per_sleep"] == 2.0 and train["shim/verified_rollouts"] == 3
    assert train["shim/stale_rollout_alarm"] == 0  # one step above the threshold is not an alarm
    assert out["seen"][0]["shim/sleeps"] == 1  # every callback (console, wandb, tensorboard) gets them
    assert not any(k.startswith("shim/") for k in evaluation)  # eval logs stay the trainer's own
    off, _ = run_trainer(SHIM_DISABLED_PATCHES="trainer-metrics")
    assert not any(k.startswith("shim/") for h in off["history"] for k in h)


def test_an_error_in_the_shim_never_stops_the_trainers_log():
    out, proc = run_trainer(BREAK="1")
    assert "raised" not in out
    assert out["history"][0]["loss"] == 1.0 and not any(k.startswith("shim/") for k in out["history"][0])
    warnings = [line for line in proc.stderr.splitlines() if "WARNING trainer-metrics" in line]
    assert len(warnings) == 1 and "ZeroDivisionError" in warnings[0] and "training goes on" in warnings[0]
    strict, proc = run_trainer(BREAK="1", SHIM_STRICT="1")
    assert strict["raised"].startswith("ZeroDivisionError") and strict["history"] == []


# ---------------------------------------------------------------------------
# the alarm's rule
# ---------------------------------------------------------------------------
class Trainer:
    def __init__(self, main=True):
        self.main = main

    def is_world_process_zero(self):
        return self.main


@pytest.fixture
def alarm(monkeypatch):
    fired = []
    trainer_metrics.reset()
    monkeypatch.setattr(trainer_metrics, "_alarm", lambda trainer, key, seen, threshold: fired.append((key, seen, threshold)))
    monkeypatch.delenv(config.SHIM_STALE_ALARM, raising=False)
    yield fired
    trainer_metrics.reset()


def test_alarm_needs_two_consecutive_steps_and_fires_once(alarm):
    for step, value in enumerate([0.2, 0.01, 0.3, 0.04, 0.06, 0.07, 0.9, 0.8], 1):
        trainer_metrics.observe(Trainer(), {LOGP: value}, step)
    assert alarm == [(LOGP, [(5, 0.06), (6, 0.07)], 0.05)]


def test_alarm_ignores_steps_without_the_metric_and_reads_ms_swift(alarm):
    trainer_metrics.observe(Trainer(), {"rollout_correction/log_ppl_abs_diff": 0.4}, 1)
    trainer_metrics.observe(Trainer(), {"loss": 0.1}, 2)  # e.g. the end-of-training summary
    trainer_metrics.observe(Trainer(), {"rollout_correction/log_ppl_abs_diff": float("nan")}, 3)  # NaN: no reading
    assert alarm == []
    trainer_metrics.observe(Trainer(), {"rollout_correction/log_ppl_abs_diff": 0.5}, 4)
    assert alarm == [("rollout_correction/log_ppl_abs_diff", [(1, 0.4), (4, 0.5)], 0.05)]


def test_alarm_threshold_from_env(alarm, monkeypatch):
    monkeypatch.setenv(config.SHIM_STALE_ALARM, "0.5")
    for step in (1, 2, 3):
        trainer_metrics.observe(Trainer(), {LOGP: 0.3}, step)
    assert alarm == []
    trainer_metrics.observe(Trainer(), {LOGP: 0.6}, 4)
    trainer_metrics.observe(Trainer(), {LOGP: 0.7}, 5)
    assert [a[2] for a in alarm] == [0.5]


@pytest.mark.parametrize("value", ["0", "-1", "high", "nan", "inf"])
def test_bad_threshold_names_variable(monkeypatch, value):
    monkeypatch.setenv(config.SHIM_STALE_ALARM, value)
    with pytest.raises(config.ConfigError, match=f"SHIM_STALE_ALARM='{value}' is not valid; accepted: a number > 0"):
        config.validate()


def test_alarm_warns_on_the_main_process_only(monkeypatch):
    from shim.engine import log

    lines = []
    monkeypatch.setattr(log, "warning", lambda m: lines.append(("WARNING", m)))
    monkeypatch.setattr(log, "debug", lambda m: lines.append(("DEBUG", m)))
    for main in (True, False):
        trainer_metrics.reset()
        for step in (1, 2):
            trainer_metrics.observe(Trainer(main), {LOGP: 0.5}, step)
    trainer_metrics.reset()
    assert [level for level, _ in lines] == ["WARNING", "DEBUG"]
