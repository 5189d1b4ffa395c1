"""Environment switches of the shim: one constant per variable, read here only.

Every switch is read when it is needed (not cached at import), so a test or a
launcher can set it before the shim activates. A value outside the accepted set
is a :class:`ConfigError` whose message names the variable and the accepted
values.
"""
from __future__ import annotations

import os

SHIM_DISABLED = "SHIM_DISABLED"
"""Boolean. True turns the shim off in every way in (``import shim.auto``,
``python -m shim``, the ``.pth`` file): nothing is hooked or wrapped."""

SHIM_DISABLED_PATCHES = "SHIM_DISABLED_PATCHES"
"""Comma-separated patch ids (see ``python -m shim status``) to leave off, or
``*`` for all of them. An unknown id is one WARNING naming it and the valid ids;
the other patches stay on."""

SHIM_STRICT = "SHIM_STRICT"
"""Boolean. True makes a patch that fails to apply, an ineffective sleep that
cannot be repaired and similar problems raise instead of logging one line."""

SHIM_DEBUG = "SHIM_DEBUG"
"""Boolean. True logs at DEBUG level (every wrapper call that decides something)."""

SHIM_TRACE = "SHIM_TRACE"
"""Path of a JSON-lines file. Every sleep/wake event of every rank is appended
to it (one record per line, rank in each record). Empty: no trace."""

SHIM_DEVICE_CHECK_EVERY = "SHIM_DEVICE_CHECK_EVERY"
"""Positive integer (default 10). The sleep check reads the device (``mem_get_info``
before and after) at least every this many sleeps of an engine, besides the sleeps
that need it (first sleep at each level, after an ineffective one, when the sleep
pool's bookkeeping looks wrong); the others are verified from the pool's bookkeeping
(``shim.vllm.sleep_verdict``). ``1``: every sleep and wake is read on the device."""


SHIM_VERIFY_WEIGHTS = "SHIM_VERIFY_WEIGHTS"
"""``1`` (or ``true``/``yes``/``on``/``exact``): right before each generate of a colocated
engine (TRL ``VLLMGeneration``, GRPO/RLOO 0.25-0.27, OnlineDPO, GOLD; ms-swift colocate),
compare exact digests of every engine tensor with the trainer's current weights
(``shim.verify``: a position-sensitive hash of the bit patterns after rounding to the
engine's dtype, computed on the device). ``sample``: a different slice of 8 tensors per
check (every tensor within ceil(tensors / 8) checks). ``0``/unset: off. A mismatch is a
WARNING with the words ``stale weights`` (SHIM_STRICT raises). CLI: ``python -m shim
--verify-weights`` sets ``1``."""

SHIM_STALE_ALARM = "SHIM_STALE_ALARM"
"""Float > 0, default 0.05. The stale-rollout alarm (``shim.observe.trainer_metrics``): one WARNING
when the trainer's logged logp difference between vLLM's sampling and the trainer
(TRL ``sampling/sampling_logp_difference/mean``, ms-swift
``rollout_correction/log_ppl_abs_diff``) stays above this value for 2 logging steps
in a row. A rollout from the trainer's own weights sits near 0 (about 0.001-0.02 in
bf16); stale weights give 0.2-1 and more."""

SHIM_SUMMARY_EVERY = "SHIM_SUMMARY_EVERY"
"""Integer >= 0, default 50. Sleep/wake lines after each engine's first sleep and
wake are DEBUG; a one-line INFO summary comes every this many sleeps (and at least
every 10 minutes while the engine sleeps and wakes). 0: only the summary at exit."""

SHIM_SLEEP_LEVEL = "SHIM_SLEEP_LEVEL"
"""``1`` or ``2``; unset: the trainer's own level. The level every sleep of TRL's colocated engine
runs at (``VLLMGeneration``, trl >= 0.28: GRPO, RLOO, GOLD, the distillation trainers), which TRL
hard-codes to 2 (``sleep(level=2)`` after construction and after every generate). ``1`` keeps a copy
of the weights in host memory (as much CPU RAM as the weights take, per rank) and restores it at the
wake, plain tensors of the weights pool included; the trainer's weights are still pushed before
generating (TRL >= 1.10 itself, 0.28-1.9.2 through the shim), so nothing else changes. What
vllm-ascend MoE users need (level 2 there: vllm-ascend#13012, #13352, #16725). ms-swift's
``--sleep_level`` is the user's own: the switch never touches it. Patch ``trl-sleep-level``."""

ALL = (SHIM_DISABLED, SHIM_DISABLED_PATCHES, SHIM_STRICT, SHIM_DEBUG, SHIM_TRACE, SHIM_VERIFY_WEIGHTS,
       SHIM_DEVICE_CHECK_EVERY, SHIM_STALE_ALARM, SHIM_SUMMARY_EVERY, SHIM_SLEEP_LEVEL)

STALE_ALARM_DEFAULT = 0.05
SUMMARY_EVERY_DEFAULT = 50

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class ConfigError(ValueError):
    """An environment switch has a value the shim does not accept."""


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not valid; accepted: 1, 0, true, false, yes, no, on, off (or unset)"
    )


def switched_on(name: str) -> bool:
    """Whether the environment switch ``name`` is set to something other than off (never raises)."""
    return os.environ.get(name, "").strip().lower() not in _FALSE


def disabled() -> bool:
    return _flag(SHIM_DISABLED)


def strict() -> bool:
    """SHIM_STRICT, read where a failure is handled: a bad value counts as off here (never raises;
    :func:`validate` reports it once, at activation)."""
    try:
        return _flag(SHIM_STRICT)
    except ConfigError:
        return False


def debug() -> bool:
    return _flag(SHIM_DEBUG)


VERIFY_OFF, VERIFY_SAMPLE, VERIFY_EXACT = "", "sample", "exact"
VERIFY_DEFAULT = VERIFY_EXACT
"""What ``SHIM_VERIFY_WEIGHTS=1`` means. Exact: every mapped tensor at every check, since the batched
Triton digest made it cheap (docs/evidence.md, "weight verification"; tests/gpu/test_verify_weights.py
holds the goal: under 1% of a GRPO step and within 5x of the floor of reading both copies once)."""


def verify_weights() -> str:
    """``""`` (off), ``"exact"`` (the default: ``1``) or ``"sample"`` from SHIM_VERIFY_WEIGHTS."""
    raw = os.environ.get(SHIM_VERIFY_WEIGHTS, "")
    value = raw.strip().lower()
    if value in _FALSE:
        return VERIFY_OFF
    if value in _TRUE:
        return VERIFY_DEFAULT
    if value in (VERIFY_SAMPLE, VERIFY_EXACT):
        return value
    raise ConfigError(f"{SHIM_VERIFY_WEIGHTS}={raw!r} is not valid; accepted: 1, 0, exact, sample, true, false, "
                      "yes, no, on, off (or unset)")


def trace_path() -> str | None:
    return os.environ.get(SHIM_TRACE, "").strip() or None


def stale_alarm() -> float:
    """The stale-rollout alarm's threshold (SHIM_STALE_ALARM)."""
    raw = os.environ.get(SHIM_STALE_ALARM, "")
    if not raw.strip():
        return STALE_ALARM_DEFAULT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{SHIM_STALE_ALARM}={raw!r} is not valid; accepted: a number > 0 "
                          f"(default {STALE_ALARM_DEFAULT}), or unset")
    return value


def summary_every() -> int:
    """Sleeps between two INFO summary lines (SHIM_SUMMARY_EVERY); 0: none until exit."""
    raw = os.environ.get(SHIM_SUMMARY_EVERY, "")
    if not raw.strip():
        return SUMMARY_EVERY_DEFAULT
    if not raw.strip().isdigit():
        raise ConfigError(f"{SHIM_SUMMARY_EVERY}={raw!r} is not valid; accepted: an integer >= 0 "
                          f"(default {SUMMARY_EVERY_DEFAULT}; 0: only the summary at exit), or unset")
    return int(raw.strip())


SLEEP_LEVELS = (1, 2)


def sleep_level() -> "int | None":
    """SHIM_SLEEP_LEVEL as an int (1 or 2), or None when unset."""
    raw = os.environ.get(SHIM_SLEEP_LEVEL, "")
    value = raw.strip()
    if not value:
        return None
    if value in {str(level) for level in SLEEP_LEVELS}:
        return int(value)
    raise ConfigError(f"{SHIM_SLEEP_LEVEL}={raw!r} is not valid; accepted: 1, 2 (or unset: the trainer's own level)")


def disabled_patches(known, removed=()) -> "tuple[frozenset, list]":
    """``(ids switched off, unknown ids)`` from SHIM_DISABLED_PATCHES (``*``: all of ``known``).

    An id that is neither ``known`` nor ``removed`` (a patch deleted on schedule) is returned in
    the second list for ONE warning; it never turns the shim off (patches are deleted on
    schedule, and a user who once disabled one must keep every other fix after an upgrade)."""
    raw = os.environ.get(SHIM_DISABLED_PATCHES, "")
    items = [x.strip() for x in raw.split(",") if x.strip()]
    if "*" in items:
        return frozenset(known), []
    unknown = [x for x in items if x not in known and x not in removed]
    return frozenset(x for x in items if x in known), unknown


def validate() -> None:
    """Raise ConfigError for the first switch with a bad value (booleans, SHIM_VERIFY_WEIGHTS, the
    alarm threshold, the summary interval, the sleep level)."""
    disabled()
    _flag(SHIM_STRICT)
    debug()
    verify_weights()
    stale_alarm()
    summary_every()
    sleep_level()


DEVICE_CHECK_EVERY_DEFAULT = 10


def device_check_every() -> int:
    raw = os.environ.get(SHIM_DEVICE_CHECK_EVERY, "").strip()
    if not raw:
        return DEVICE_CHECK_EVERY_DEFAULT
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise ConfigError(f"{SHIM_DEVICE_CHECK_EVERY}={raw!r} is not valid; accepted: a whole number >= 1 (or unset)")
