"""The ``shim`` logger: one line per decision, rank-aware.

Decisions (applied, stand down, disabled) are INFO on local rank 0 and DEBUG
on the other ranks, so an 8-rank job prints each once; problems are WARNING on
every rank, because each rank's memory is its own. Routine sleep/wake lines
(``event``) are INFO only where they matter (an engine's first sleep and wake,
a problem) and DEBUG otherwise; ``SHIM_DEBUG=1`` shows them all. Lines said once per
process go through :func:`once` (one registry, keyed by tuples or strings). ``logging`` is
imported on the first line logged, not at start-up.
"""
from __future__ import annotations

import os
import sys

_logger = None
_debug = False
_once: dict = {}  # key -> the token of its first :func:`once`: the keys seen in this process

DEBUG, INFO, WARNING = 10, 20, 30


def rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def local_rank() -> int:
    value = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
    return int(value) if value.isdigit() else 0


def setup(debug: bool = False) -> None:
    """Remember the level; the handler is made on first use."""
    global _debug
    _debug = debug
    if _logger is not None:
        _logger.setLevel(DEBUG if debug else INFO)


def get():
    """The ``shim`` logger, with its own stderr handler (no duplicates through root)."""
    global _logger
    if _logger is None:
        import logging

        class RankFormatter(logging.Formatter):
            def format(self, record):
                base = super().format(record)
                return f"[shim rank{rank()}] {base}" if "RANK" in os.environ else f"[shim] {base}"

        logger = logging.getLogger("shim")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(RankFormatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(DEBUG if _debug else INFO)
        _logger = logger
    return _logger


def decision(message: str) -> None:
    get().log(INFO if local_rank() == 0 else DEBUG, message)


def warning(message: str) -> None:
    get().warning(message)


def info(message: str) -> None:
    get().info(message)


def event(message: str, important: bool) -> None:
    """A routine line (a sleep, a wake): INFO when ``important``, else DEBUG (shown with SHIM_DEBUG=1)."""
    if important:
        get().info(message)
    elif _debug:
        get().debug(message)


def debugging() -> bool:
    """DEBUG lines are shown (``SHIM_DEBUG=1``)."""
    return _debug


def debug(message: str) -> None:
    if _debug:
        get().debug(message)


def once(key) -> bool:
    """True the first time ``key`` (a string or a tuple, e.g. ``("switch", name)``) is seen in this process,
    False after; thread-safe (``dict.setdefault`` is one step under the GIL)."""
    token = object()
    return _once.setdefault(key, token) is token


def warning_once(key, message: str) -> None:
    """``message`` as a WARNING the first time ``key`` is seen, as a DEBUG line after."""
    if once(key):
        warning(message)
    else:
        debug(message)


def forget(key) -> None:
    """Forget ``key`` and every tuple key that starts with it (``forget("switch")`` forgets
    ``("switch", name)`` of every name), so the next :func:`once` of them is True again (tests)."""
    prefix = key if isinstance(key, tuple) else (key,)
    for seen in list(_once):
        if seen == key or (isinstance(seen, tuple) and seen[:len(prefix)] == prefix):
            _once.pop(seen, None)
