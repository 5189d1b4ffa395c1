"""What weight verification counts and says: the verdict counts, the one-per-reason WARNINGs, the stale-weights
verdict (a WARNING, or :class:`StaleWeights` with ``SHIM_STRICT=1``) and the ``verify`` trace record.

Shared by every verify record (TRL / ms-swift through :mod:`shim.verify.weights`, verl through
``shim.verl.verify_weights``); :mod:`shim.verify.weights` re-exports the public names.
"""
from __future__ import annotations

import math
import os
import threading
import time

from shim.engine import config, log

WARN_FIRST = 5
"""Stale generates logged one WARNING each; after that one WARNING every :data:`WARN_EVERY`."""
WARN_EVERY = 50
SHOW = 3
"""Tensors named in a WARNING."""


class StaleWeights(RuntimeError):
    """Raised with SHIM_STRICT=1: the engine was about to sample from other weights than the trainer's."""


_lock = threading.Lock()
_counts = {"verified": 0, "partly_verified": 0, "stale": 0, "unverifiable": 0, "seconds": 0.0}
_read: dict = {}       # bytes one exact check reads: {"engine": ..., "trainer": ...} (the bench's floor)
_times: list = []      # the shim's own seconds per verification (bench: median cost per generate)


def counts() -> dict:
    """``verified``, ``partly_verified``, ``stale``, ``unverifiable``, ``seconds`` (the shim's own time in
    verification), ``times``; also ``shim.observe.events.count("rollouts_<verdict>")``."""
    with _lock:
        out = dict(_counts)
        out["times"] = list(_times)
        out["bytes_per_exact_check"] = dict(_read)
        return out


def forget() -> None:
    """Forget the reasons already said (tests)."""
    log.forget("verify-weights")


def record(key: str, seconds: "float | None" = None, share: "float | None" = None) -> None:
    """Count one verdict (``verified``, ``partly_verified``, ``stale``, ``unverifiable``); ``seconds``: the
    check's own time; ``share``: the verified share of the engine's bytes (a check that ran)."""
    with _lock:
        _counts[key] += 1
        if seconds is not None:  # a check that ran (its time is the bench's figure)
            _counts["seconds"] += seconds
            if len(_times) < 100000:
                _times.append(seconds)
    from shim.observe import events

    events.count(f"rollouts_{key}")
    if share is not None:
        events.gauge("verified_share", round(share, 4))


def warn_once(reason: str, message: str) -> None:
    """``message`` as one WARNING per ``reason`` and process (a DEBUG line after)."""
    log.warning_once(("verify-weights", reason), message)


def note_bytes(descs: dict, names: list, params: dict) -> None:
    """What one exact check reads: every worker's mapped engine bytes, the trainer slices they map."""
    import torch

    engine = trainer = 0
    for desc in descs.values():
        for name in names:
            d = desc["params"][name]
            n = math.prod(d["shape"]) if d["shape"] else 1
            engine += n * getattr(torch, d["dtype"]).itemsize
            lay = d["layout"]
            for piece in lay["pieces"]:
                slot = len(piece) > 4  # fused experts: one slot of dim 0, ``dim`` within it
                size = n // d["shape"][0] if slot else n
                part = n if lay.get("scalar") else size // d["shape"][lay["dim"] + slot] * piece[2]
                trainer += part * params[piece[0]].element_size()
    with _lock:
        _read.update(engine=engine, trainer=trainer)


def trace(engine: str, site: str, mode, verdict, step, version, differ, seconds, share, skipped) -> None:
    """The ``verify`` record of one check (``SHIM_TRACE``)."""
    path = config.trace_path()
    if not path:
        return
    from shim.observe import events

    rec = {"v": events.SCHEMA, "event": "verify", "t": time.time(), "seconds": seconds, "rank": log.rank(),
           "local_rank": log.local_rank(), "pid": os.getpid(), "host": events.host(),
           "engine": engine, "site": site, "mode": mode, "verdict": verdict, "step": step,
           "weight_version": version, "differing": differ[:SHOW], "share": None if share is None else round(share, 4),
           "skipped": skipped[:SHOW], "skipped_count": len(skipped)}
    try:
        events.write_trace(path, rec)
    except OSError as exc:
        warn_once(f"trace {path}", f"{config.SHIM_TRACE}={path}: cannot append: {exc}")


def report_stale(engine: str, site: str, differ: list, mode: str, step, version, stale: int, total: int,
                 finding: str, unit: str, note: str = "") -> None:
    """The one stale-weights verdict of every verify record: a WARNING naming the first :data:`SHOW` tensors
    (the first :data:`WARN_FIRST` stale ``unit`` of an engine, then every :data:`WARN_EVERY`), or
    :class:`StaleWeights` with ``SHIM_STRICT=1``. ``finding``: what differs, in the site's words; ``note``: what
    the differing tensors suggest (a sentence, before the usual advice)."""
    shown = ", ".join(differ[:SHOW]) + (f" and {len(differ) - SHOW} more" if len(differ) > SHOW else "")
    message = (f"verify-weights {engine} ({site}): stale weights at step "
               f"{'?' if step is None else step} (engine weight version {version or '-'}): {finding} "
               f"({mode} digests; first differing: {shown}); "
               f"stale at {stale} of {total} verified {unit} of this engine. {note}"
               "A weight push did not land: check `python -m shim status` (a patch disabled or standing down?)")
    if config.strict():
        raise StaleWeights("[shim] " + message)
    if stale <= WARN_FIRST or stale % WARN_EVERY == 0:
        if stale == WARN_FIRST:
            message += f"; further stale {unit} of this engine are logged every {WARN_EVERY}"
        log.warning(message)
    else:
        log.debug(message)
