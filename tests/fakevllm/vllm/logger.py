"""Mirrors vllm/logger.py ``init_logger`` (a stdlib logger under "vllm")."""
import logging
import os

_root = logging.getLogger("vllm")
if not _root.handlers:
    _h = logging.StreamHandler()
    _h.setFormatter(logging.Formatter("%(levelname)s [fakevllm %(filename)s] %(message)s"))
    _root.addHandler(_h)
    _root.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper())
    _root.propagate = False


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("vllm") else "vllm." + name)
