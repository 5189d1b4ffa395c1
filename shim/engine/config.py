"""Environment switches of the shim: one constant per variable, read here only.

Every switch is read when it is needed (not cached at import), so a test or a
launcher can set it before the shim activates. A value outside the accepted set
turns off only what that switch controls: :func:`read` (every accessor here) logs
ONE WARNING naming the variable, the value and the accepted values, and returns the
switch's default; every fix stays on. :func:`check` (activation) raises the
:class:`ConfigError` instead under SHIM_STRICT=1; :func:`problems` is what the
launcher and ``doctor`` report before anything starts.
"""
from __future__ import annotations

import os

SHIM_DISABLED = "SHIM_DISABLED"
"""Boolean. True turns the shim off in every way in (``import shim.auto``,
``python -m shim``, the ``.pth`` file): nothing is hooked or wrapped."""

SHIM_DISABLED_PATCHES = "SHIM_DISABLED_PATCHES"
"""Comma-separated patch ids (see ``python -m shim status --all``) to leave off, or
``*`` for all of them. An unknown id is one short WARNING naming it and the closest
known ids; the other patches stay on."""

DISABLED_PATCHES_REPORTED = "_SHIM_DISABLED_PATCHES_REPORTED"
"""Not a switch: the launcher, having warned about the unknown ids of SHIM_DISABLED_PATCHES before
COMMAND starts, puts that value here, so COMMAND and its children (torchrun ranks, workers) do not
print the same WARNING again. A child whose SHIM_DISABLED_PATCHES differs still warns."""

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
DEVICE_CHECK_EVERY_DEFAULT = 10
SLEEP_LEVELS = (1, 2)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

VERIFY_OFF, VERIFY_SAMPLE, VERIFY_EXACT = "", "sample", "exact"
VERIFY_DEFAULT = VERIFY_EXACT
"""What ``SHIM_VERIFY_WEIGHTS=1`` means. Exact: every mapped tensor at every check, since the batched
Triton digest made it cheap (docs/evidence.md, "weight verification"; tests/gpu/test_verify_weights.py
holds the goal: under 1% of a GRPO step and within 5x of the floor of reading both copies once)."""


class ConfigError(ValueError):
    """An environment switch has a value the shim does not accept: ``name``, the ``value`` and
    ``instead``, what the shim does with it (the default: what the switch controls stays off)."""

    def __init__(self, message: str, name: str = "", value: str = "", instead: str = ""):
        super().__init__(message)
        self.name, self.value, self.instead = name, value, instead

    def line(self) -> str:
        """The one line a bad value is (the WARNING of :func:`read`, ``doctor``'s BAD SWITCH row)."""
        return f"{self}; {self.instead}" if self.instead else str(self)


# -- parsers: the value, or ValueError for a value outside the accepted set ------------------------
def _bool(value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError


def _verify(value: str) -> str:
    value = value.lower()
    if value in (VERIFY_SAMPLE, VERIFY_EXACT):
        return value
    return VERIFY_DEFAULT if _bool(value) else VERIFY_OFF


def _whole(least: int):
    def parse(value: str) -> int:
        if not value:
            raise LookupError  # unset: the default
        if not value.isdigit() or int(value) < least:
            raise ValueError
        return int(value)
    return parse


def _threshold(value: str) -> float:
    if not value:
        raise LookupError
    number = float(value)  # ValueError for text
    if not number > 0 or number == float("inf"):  # nan and inf too
        raise ValueError
    return number


def _level(value: str) -> "int | None":
    if not value:
        return None
    if value not in {str(level) for level in SLEEP_LEVELS}:
        raise ValueError
    return int(value)


def _text(value: str) -> str:
    return value  # any text: SHIM_TRACE's path is checked where it is opened, the disable list by id


_BOOL = "1, 0, true, false, yes, no, on, off (or unset)"
_SWITCHES = {  # name: (parse the stripped value, default, accepted values, what a bad value leaves on or off)
    SHIM_DISABLED: (_bool, False, _BOOL, "the shim stays on"),
    SHIM_DISABLED_PATCHES: (_text, "", "patch ids, comma-separated, or *", "no patch disabled"),
    SHIM_STRICT: (_bool, False, _BOOL, "strict mode off"),
    SHIM_DEBUG: (_bool, False, _BOOL, "debug lines off"),
    SHIM_TRACE: (_text, "", "a file path (or unset)", "no trace"),
    SHIM_VERIFY_WEIGHTS: (_verify, VERIFY_OFF, "1, 0, exact, sample, true, false, yes, no, on, off (or unset)",
                          "weight verification off"),
    SHIM_DEVICE_CHECK_EVERY: (_whole(1), DEVICE_CHECK_EVERY_DEFAULT, "a whole number >= 1 (or unset)",
                              f"using {DEVICE_CHECK_EVERY_DEFAULT}"),
    SHIM_STALE_ALARM: (_threshold, STALE_ALARM_DEFAULT, f"a number > 0 (default {STALE_ALARM_DEFAULT}), or unset",
                       f"using {STALE_ALARM_DEFAULT}"),
    SHIM_SUMMARY_EVERY: (_whole(0), SUMMARY_EVERY_DEFAULT,
                         f"an integer >= 0 (default {SUMMARY_EVERY_DEFAULT}; 0: only the summary at exit), or unset",
                         f"using {SUMMARY_EVERY_DEFAULT}"),
    SHIM_SLEEP_LEVEL: (_level, None, "1, 2 (or unset: the trainer's own level)", "TRL's own sleep level is used"),
}
assert set(_SWITCHES) == set(ALL)


def _parse(name: str):
    """``(value, None)``, or ``(default, ConfigError)`` for a value outside the accepted set."""
    parse, default, accepted, _ = _SWITCHES[name]
    raw = os.environ.get(name, "")
    try:
        return parse(raw.strip()), None
    except LookupError:  # unset or empty
        return default, None
    except ValueError:
        return default, ConfigError(f"{name}={raw!r} is not valid; accepted: {accepted}", name, raw,
                                    _SWITCHES[name][3])


def problem(name: str) -> "ConfigError | None":
    """The error of switch ``name``'s value, or None when it is accepted (or unset)."""
    return _parse(name)[1]


def problems() -> list:
    """One :class:`ConfigError` per switch of :data:`ALL` whose value is not accepted, in that order."""
    return [error for error in map(problem, ALL) if error is not None]


def read(name: str):
    """The value of switch ``name``; a bad value is ONE WARNING per process (naming the variable, the
    value, the accepted values and what is used instead) and the switch's default. Never raises: read
    inside wrappers, where nothing may, and a typo in one switch never turns another fix off."""
    value, error = _parse(name)
    if error is not None:
        from shim.engine import log

        if log.once(("switch", name)):
            log.warning(error.line())
    return value


def check() -> None:
    """At activation: under SHIM_STRICT=1 raise :class:`ConfigError` for the first bad switch, else one
    WARNING per bad switch (each then reads as its default). Nothing to check while SHIM_DISABLED=1."""
    if problem(SHIM_DISABLED) is None and disabled():
        return
    errors = problems()
    if errors and problem(SHIM_STRICT) is None and strict():
        raise errors[0]
    for name in ALL:
        read(name)


def validate() -> None:
    """Raise ConfigError for the first switch with a bad value (the launcher and ``status`` check
    before anything starts)."""
    errors = problems()
    if errors:
        raise errors[0]


def switched_on(name: str) -> bool:
    """Whether switch ``name`` reads as on: :func:`read`'s value without its WARNING (a bad value is the
    default, which is off for every feature switch); never raises."""
    return bool(_parse(name)[0])


def disabled() -> bool:
    return read(SHIM_DISABLED)


def strict() -> bool:
    """SHIM_STRICT, read where a failure is handled (a bad value: off, one WARNING)."""
    return read(SHIM_STRICT)


def debug() -> bool:
    return read(SHIM_DEBUG)


def verify_weights() -> str:
    """``""`` (off), ``"exact"`` (the default: ``1``) or ``"sample"`` from SHIM_VERIFY_WEIGHTS."""
    return read(SHIM_VERIFY_WEIGHTS)


def trace_path() -> "str | None":
    """SHIM_TRACE's path, or None (unset); whether it can be appended to is checked where it is opened."""
    return read(SHIM_TRACE) or None


def stale_alarm() -> float:
    """The stale-rollout alarm's threshold (SHIM_STALE_ALARM)."""
    return read(SHIM_STALE_ALARM)


def summary_every() -> int:
    """Sleeps between two INFO summary lines (SHIM_SUMMARY_EVERY); 0: none until exit."""
    return read(SHIM_SUMMARY_EVERY)


def sleep_level() -> "int | None":
    """SHIM_SLEEP_LEVEL as an int (1 or 2), or None when unset."""
    return read(SHIM_SLEEP_LEVEL)


def device_check_every() -> int:
    """SHIM_DEVICE_CHECK_EVERY (default 10)."""
    return read(SHIM_DEVICE_CHECK_EVERY)


def disabled_patches(known, removed=(), bugs=None) -> "tuple[frozenset, list]":
    """``(ids switched off, unknown ids)`` from SHIM_DISABLED_PATCHES (``*``: all of ``known``).

    ``bugs`` (bug id -> its site ids): a bug id turns off every site of that bug; a site id alone
    still works (see :func:`site_aliases`). An id that is neither known, a bug, nor ``removed`` (a patch
    deleted on schedule) is returned in the second list for ONE warning; it never turns the shim off
    (patches are deleted on schedule, and a user who once disabled one must keep every other fix after
    an upgrade)."""
    items = disabled_items()
    if "*" in items:
        return frozenset(known), []
    bugs = bugs or {}
    off = {x for x in items if x in known}
    for x in items:
        off.update(s for s in bugs.get(x, ()) if s in known)
    unknown = [x for x in items if x not in known and x not in bugs and x not in removed]
    return frozenset(off), unknown


def disabled_items() -> list:
    raw = os.environ.get(SHIM_DISABLED_PATCHES, "")
    return [x.strip() for x in raw.split(",") if x.strip()]


def site_aliases(bugs: dict) -> list:
    """``(site id, bug id)`` for each id of SHIM_DISABLED_PATCHES that is one site of a bug with several:
    it turns off that site only (as before bugs were the unit); the bug id turns them all off."""
    items = disabled_items()
    if "*" in items:
        return []
    site_bug = {site: bug for bug, sites in bugs.items() if len(sites) > 1 for site in sites}
    return [(x, site_bug[x]) for x in items if x in site_bug and x not in bugs and site_bug[x] not in items]


def unknown_patches_warning(unknown: list, known) -> str:
    """The one WARNING line for the ``unknown`` ids of SHIM_DISABLED_PATCHES: at most three of them, and
    at most three known ids that resemble them (``difflib``), never the whole list of ids (68 of them,
    1,800 characters: the warning a user mistyping one id must be able to read)."""
    import difflib  # only on this path: ``import shim.auto`` keeps its start-up module list

    known = list(known)
    close = []  # the best match of each unknown id first, then the second best...
    matches = [difflib.get_close_matches(name, known, n=3, cutoff=0.6) for name in unknown[:3]]
    for rank in range(3):
        for found in matches:
            if rank < len(found) and found[rank] not in close:
                close.append(found[rank])
    shown = ", ".join(repr(x if len(x) <= 40 else x[:39] + "~") for x in unknown[:3])
    more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
    hint = f"did you mean {', '.join(close[:3])}?" if close else "no known id resembles it"
    return (f"{SHIM_DISABLED_PATCHES}: unknown patch id{'s' if len(unknown) > 1 else ''} {shown}{more} ignored; "
            f"{hint} (every id: python -m shim status --all)")


def unknown_patches_reported() -> bool:
    """Whether the launcher already warned about this process's SHIM_DISABLED_PATCHES value."""
    value = os.environ.get(DISABLED_PATCHES_REPORTED)
    return value is not None and value == os.environ.get(SHIM_DISABLED_PATCHES, "")
