"""The shim's figures in the trainer's own logged metrics, and the stale-rollout alarm.

Bound to ``transformers.trainer.Trainer.log`` by ``patches/trainer_metrics.py``: at every logging step, before
the trainer records its logs, keys ``shim/<name>`` are added (:func:`figures`) and the trainer's own measure of
how far vLLM's sampling log-probs are from the trainer's feeds the stale-rollout alarm (:func:`observe`). The
base ``Trainer.log``, not a ``TrainerCallback``: ``Trainer.log`` appends to ``state.log_history`` before it
calls ``on_log``, so a callback's additions would never be recorded (:func:`wrap_log` says more). Never the
reason training stops: any error in here is logged once (WARNING, then DEBUG) and the trainer's ``log`` runs
unchanged; ``SHIM_STRICT=1`` raises.
"""
from __future__ import annotations

import math
import threading

from shim.engine import config, log
from shim.observe import events

WATCHED = ("sampling/sampling_logp_difference/mean", "rollout_correction/log_ppl_abs_diff")
"""Trainer metrics the alarm reads, first present wins (TRL, ms-swift 4.x)."""

CONSECUTIVE = 2
"""Logging steps in a row above the threshold before the alarm fires."""

PREFIX = "shim/"
_BASE = ("sleeps", "ineffective", "freed", "engines")

_lock = threading.Lock()
_state = {"sleeps": 0, "freed": 0, "streak": [], "fired": False}


def _number(value) -> "float | None":
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def figures() -> dict:
    """The ``shim/`` keys for one logging step (advances the per-interval figures).

    ``shim/sleeps`` and ``shim/ineffective_sleeps`` (measured sleeps of this process so far; present once
    the shim saw an engine), ``shim/gib_freed_per_sleep`` (mean over the sleeps since the previous logging
    step; absent when there were none), and every counter of ``shim.observe.events.count`` once it is
    non-zero (``shim/weight_pushes``: trained weights written into the engine, TRL's through the shim's
    push paths of ``shim.trl.synced_llm``, ms-swift's each ``_move_model_to_vllm`` (:func:`count_push`);
    ``shim/rollouts_verified`` / ``shim/rollouts_partly_verified`` / ``shim/rollouts_stale`` from weight
    verification, and ``shim/verified_share``, the verified share of the engine's bytes at the last check:
    below 1 where tensors were left out; ...). Counts are per process (rank): the console, wandb and
    tensorboard show rank 0's, as for every other metric.
    """
    t = events.totals()
    out = {}
    with _lock:
        if t["engines"] or t["sleeps"]:
            out[PREFIX + "sleeps"] = t["sleeps"]
            out[PREFIX + "ineffective_sleeps"] = t["ineffective"]
            new = t["sleeps"] - _state["sleeps"]
            if new > 0:
                out[PREFIX + "gib_freed_per_sleep"] = round((t["freed"] - _state["freed"]) / new / events.GiB, 4)
            _state["sleeps"], _state["freed"] = t["sleeps"], t["freed"]
    for name, value in sorted(t.items()):
        if name not in _BASE and value:
            out[PREFIX + name] = value
    for name, value in sorted(events.gauges().items()):  # 0 included: a share of 0 is news
        out[PREFIX + name] = value
    return out


def observe(trainer, logs: dict, step) -> "float | None":
    """Feed the alarm one logging step; returns the watched value (None when absent).

    The watched value: TRL ``sampling/sampling_logp_difference/mean`` (mean |logp_vLLM - logp_trainer| per
    token, logged with ``vllm_importance_sampling_correction``, TRL's default); ms-swift 4.x
    ``rollout_correction/log_ppl_abs_diff`` (logged with ``--log_rollout_offpolicy_metrics true`` or
    ``--rollout_importance_sampling_mode``; ms-swift 3.x logs no equivalent). Above ``SHIM_STALE_ALARM``
    (default 0.05) for :data:`CONSECUTIVE` logging steps in a row: one WARNING (on the world-process-zero
    rank) with the likely causes and what to check; ``shim/stale_rollout_alarm`` (0 / 1) is logged next
    to the watched value.
    """
    key = next((k for k in WATCHED if k in logs), None)
    value = _number(logs.get(key)) if key else None
    if value is None:
        return None
    threshold = config.stale_alarm()
    with _lock:
        streak = _state["streak"]
        if value > threshold:
            streak.append((step, value))
        else:
            streak.clear()
        fire = len(streak) >= CONSECUTIVE and not _state["fired"]
        if fire:
            _state["fired"] = True
            seen = list(streak)
    if fire:
        _alarm(trainer, key, seen, threshold)
    return value


def _not_acting() -> str:
    """Patches that are disabled, failed or stood down for a reason other than the release."""
    from shim.engine import registry
    from shim.engine.patch import DISABLED, FAILED, STAND_DOWN

    out = []
    for pid, d in sorted(registry.decisions().items()):
        if d.decision in (DISABLED, FAILED) or (
                d.decision == STAND_DOWN and not d.reason.startswith(("version not in", "fixed upstream",
                                                                                "removed"))):
            out.append(f"{pid} ({d.text()})")
    return ", ".join(out)


def _alarm(trainer, key: str, seen: list, threshold: float) -> None:
    values = ", ".join(f"{v:.3g} at step {s}" for s, v in seen)
    off = _not_acting()
    patches = (f" Shim patches not acting in this process: {off}." if off
               else " Every shim patch for this environment is applied or not needed here.")
    message = (f"stale rollouts? {key} stayed above {threshold:g} for {len(seen)} logging steps in a row "
               f"({values}): vLLM is sampling from different weights (or inputs) than the trainer scores. "
               f"Likely causes: stale or discarded weights in the engine (a weight push that did not land, "
               f"a level-2 sleep refilled from the checkpoint on disk: huggingface/trl#5312), a shim patch "
               f"standing down or disabled, a tokenizer or chat-template mismatch between the trainer and vLLM."
               f"{patches} Check: rerun with SHIM_VERIFY_WEIGHTS=1 (compares the engine's weights with the "
               f"trainer's before each generate) and `python -m shim status --import` (each patch's decision). "
               f"Healthy runs stay near 0 (about 0.001-0.02); threshold: {config.SHIM_STALE_ALARM}={threshold:g}.")
    if _is_main(trainer):
        log.warning(message)
    else:
        log.debug(message)


def _is_main(trainer) -> bool:
    try:
        return bool(trainer.is_world_process_zero())
    except Exception:
        return log.rank() == 0


def on_log(trainer, logs: dict) -> None:
    """Add the ``shim/`` keys to ``logs`` and feed the alarm (training logs only, not eval)."""
    if any(str(k).startswith("eval_") for k in logs):
        return
    step = getattr(getattr(trainer, "state", None), "global_step", None)
    value = observe(trainer, logs, step)
    logs.update(figures())
    if value is not None:
        logs[PREFIX + "stale_rollout_alarm"] = int(_state["fired"])


def wrap_log(wrapped, instance, args, kwargs):
    """wrapt wrapper for ``Trainer.log(self, logs, start_time=None)``.

    Why the base ``Trainer.log`` and not a ``TrainerCallback``: in transformers (4.57.6 and 5.x)
    ``Trainer.log`` appends ``{**logs, "step": ...}`` to ``state.log_history`` and only then calls the
    callbacks' ``on_log``, so a callback's additions never reach ``log_history`` (nor ms-swift's
    ``logging.jsonl`` consumers that read it), and callbacks after it in the list would not see them.
    TRL's and ms-swift's trainers override ``log`` to add their own metrics (``_metrics``,
    ``custom_metrics``) and then call ``super().log(logs)``: the base method sees those metrics (the
    alarm's input) and the shim's keys are in the dict before it is recorded and handed to every
    callback (console, wandb, tensorboard, ms-swift's jsonl writer). One wrapper on one concrete class
    reaches every trainer without touching any trainer's ``__init__`` or callback list.
    """
    try:
        logs = args[0] if args else kwargs.get("logs")
        if isinstance(logs, dict):
            on_log(instance, logs)
    except Exception as exc:  # the trainer's own log must run whatever happens here
        if config.strict():
            raise
        log.warning_once(("trainer-metrics", "error"), f"trainer-metrics: shim figures left out of this log "
                         f"({type(exc).__name__}: {exc}); training goes on")
    return wrapped(*args, **kwargs)


def count_push(wrapped, instance, args, kwargs):
    """ms-swift's ``_move_model_to_vllm`` (every weight push of its rollouts, colocate or server):
    one ``weight_pushes`` once it returned."""
    result = wrapped(*args, **kwargs)
    events.count("weight_pushes")
    return result



def reset() -> None:
    """Forget the interval figures and the alarm (tests)."""
    with _lock:
        _state.update(sleeps=0, freed=0, streak=[], fired=False)
    log.forget("trainer-metrics")
