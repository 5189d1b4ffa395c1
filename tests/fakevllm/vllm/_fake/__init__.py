"""Fake-only support code of the CPU stand-in for vLLM (not an upstream module).

Holds the configuration read from the environment at import (FAKEVLLM_*), the
event log (``EVENTS`` plus the optional JSONL file named by FAKEVLLM_EVENTS) and
weight fingerprints.  Everything that mirrors upstream behaviour lives in the
regular ``vllm.*`` modules and says which upstream file/function it mirrors.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time

from packaging.version import Version


def _env(name: str, default: str) -> str:
    v = os.environ.get(name)
    return default if v is None or v == "" else v


DEVICE_TYPE = _env("FAKEVLLM_DEVICE", "cuda").lower()          # "cuda" | "npu"
if DEVICE_TYPE not in ("cuda", "npu"):
    raise ImportError(f"FAKEVLLM_DEVICE must be 'cuda' or 'npu', got {DEVICE_TYPE!r}")
TORCH_MODE = _env("FAKEVLLM_TORCH", "modern").lower()            # "modern" | "old"
if TORCH_MODE not in ("modern", "old"):
    raise ImportError(f"FAKEVLLM_TORCH must be 'modern' or 'old', got {TORCH_MODE!r}")
TOTAL_GB = float(_env("FAKEVLLM_TOTAL_GB", "80"))
ROCM = _env("FAKEVLLM_ROCM", "0") == "1"
ASCEND_VERSION = _env("FAKEVLLM_ASCEND_VERSION", "0.13.0rc1")
#: Path of a REAL vllm_ascend/worker/worker.py (from a vllm-ascend wheel): NPU mode runs its
#: ``NPUWorker.wake_up`` instead of the stand-in's mirror (vllm._fake.real_code).
ASCEND_WORKER_SRC = os.environ.get("FAKEVLLM_ASCEND_WORKER_SRC") or None
EVENTS_PATH = os.environ.get("FAKEVLLM_EVENTS") or None
#: Bytes the driver/context holds on the fake device before anything is allocated.
CONTEXT_BYTES = int(float(_env("FAKEVLLM_CONTEXT_MB", "512")) * 2**20)


def bypass_mode() -> bool:
    """pytorch#147851: with expandable segments on, allocations made inside a
    pluggable-allocator MemPool land outside it.  True on NPU (torch_npu) and on
    the "old" CUDA torch; False for the "modern" CUDA torch (measured on
    torch 2.11 + vLLM 0.24: the pool still gets everything)."""
    return DEVICE_TYPE == "npu" or TORCH_MODE == "old"


def _dist_version() -> str | None:
    try:
        import importlib.metadata as md
        return md.version("vllm")
    except Exception:
        return None


_DIST_VERSION = _dist_version()
VERSION = _env("FAKEVLLM_VERSION", _DIST_VERSION or "0.24.0")
if _DIST_VERSION is not None and Version(_DIST_VERSION) != Version(VERSION):
    raise ImportError(
        f"fake vllm: FAKEVLLM_VERSION={VERSION} but the vllm dist-info found first on "
        f"sys.path says {_DIST_VERSION}. Build a site dir for that version with "
        f"`python tests/fakevllm/make_site.py DIR --version {VERSION}` and put DIR first "
        f"on PYTHONPATH.")
V = Version(VERSION)

# ---------------------------------------------------------------------------
# event log
# ---------------------------------------------------------------------------
EVENTS: list[dict] = []
_lock = threading.Lock()
_seq = 0


def log_event(event: str, **fields) -> dict:
    """Append one record to EVENTS (and to $FAKEVLLM_EVENTS as a JSONL line)."""
    global _seq
    with _lock:
        _seq += 1
        rec = {"seq": _seq, "event": event, "pid": os.getpid(), "t": time.time()}
        rec.update(fields)
        EVENTS.append(rec)
        if EVENTS_PATH:
            with open(EVENTS_PATH, "a") as f:
                f.write(json.dumps(rec, default=str) + "\n")
    return rec


def fingerprint(named_tensors) -> str:
    """Order-independent-by-name fingerprint of (name, tensor) pairs (values cast
    to float32 on CPU).  Use it on a trainer model's ``named_parameters()`` to
    compare with the ``weights_fp`` of an event."""
    import torch
    h = hashlib.sha1()
    for name, t in sorted(((n, t) for n, t in named_tensors), key=lambda x: x[0]):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def reset_events() -> None:
    global _seq
    with _lock:
        EVENTS.clear()
        _seq = 0
