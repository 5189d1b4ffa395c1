"""The ``shim`` logger: one line per decision, rank-aware.

Decisions (applied, stand down, disabled) are INFO on local rank 0 and DEBUG
on the other ranks, so an 8-rank job prints each once; problems are WARNING on
every rank, because each rank's memory is its own.
"""
from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("shim")
_configured = False


def rank() -> int:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def local_rank() -> int:
    value = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
    return int(value) if value.isdigit() else 0


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        return f"[shim rank{rank()}] {base}" if "RANK" in os.environ else f"[shim] {base}"


def setup(debug: bool = False) -> logging.Logger:
    """Give the logger its own stderr handler once (no duplicates through root)."""
    global _configured
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_RankFormatter("%(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        _configured = True
    logger.setLevel(logging.DEBUG if debug else logging.INFO)
    return logger


def decision(message: str) -> None:
    logger.log(logging.INFO if local_rank() == 0 else logging.DEBUG, message)


def warning(message: str) -> None:
    logger.warning(message)


def debug(message: str) -> None:
    logger.debug(message)
