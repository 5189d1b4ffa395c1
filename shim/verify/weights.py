"""Weight verification (``SHIM_VERIFY_WEIGHTS``): arming, the check before each generate, and what it reports.

Whatever the cause of a missing push (an upstream bug, a patch switched off or standing down, a new trainer
release, a push that misses one tensor), a colocated engine that samples from other weights than the trainer
holds produces rollouts of the wrong policy without any error. With ``SHIM_VERIFY_WEIGHTS=1`` the shim
compares, right before vLLM samples, exact digests of the engine's weights with the trainer's current weights
(:mod:`shim.verify.digest`, computed where the tensors live); on a mismatch it logs one WARNING with the words
``stale weights`` (the engine, the trainer's step, the engine's weight version, the first tensors that
differ), or raises :class:`StaleWeights` with ``SHIM_STRICT=1``. Wiring: :class:`armed`,
:func:`before_generate`; modes: :func:`requested`; never silently off: :func:`unverifiable`; the weight
version: :func:`_tag`; counts: :func:`counts`.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from shim.engine import config, log
from shim.verify import check, compare, report, transport
from shim.verify.report import (  # noqa: F401
    SHOW,
    WARN_EVERY,
    WARN_FIRST,
    StaleWeights,
    counts,
    record,
    report_stale,
    warn_once,
)

VLLM_RECORD = "verify-weights-vllm"
"""The engine half: the check before ``LLM.generate``/``chat`` (ms-swift's records check on their own)."""
NOT_TRL = ("verify-weights-verl", "verify-weights-vllm-worker")
"""Record id prefixes of verl's verification (``shim.verl.verify_weights``: the trainer half, the rollout
server's and the vLLM worker's parts): no TRL-style arming, never the partner of :data:`VLLM_RECORD`."""
SELF_CHECKING = ("verify-weights-swift", *NOT_TRL)
"""Record id prefixes that run the check themselves (not through :data:`VLLM_RECORD`)."""


_lock = threading.Lock()
_targets: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_reasons: dict = {}    # engine name -> why it cannot be verified (this process)


def reset() -> None:
    """Forget what was said and why engines were unverifiable (tests)."""
    report.forget()
    with _lock:
        _reasons.clear()


def requested() -> str:
    """The ``SHIM_VERIFY_WEIGHTS`` mode asked for (``exact``/``sample``), or ``""`` (off or a bad value).

    Modes: ``exact`` (``1``, the default: every mapped tensor at every check) and ``sample``
    (:data:`shim.verify.compare.TENSORS` tensors per check, a different slice each time, so every
    mapped tensor is compared within ``ceil(mapped / TENSORS)`` consecutive checks; of each about
    :data:`shim.verify.compare.ELEMENTS` elements in strided rows, the first row moving on each pass).
    """
    return config.verify_weights()


# ---------------------------------------------------------------------------
# not running although asked for
# ---------------------------------------------------------------------------
def _down(decision) -> "str | None":
    """A decision that means "asked for but not applied here" (not: another release's record)."""
    if decision is None:
        return None
    kind, reason = getattr(decision, "decision", ""), getattr(decision, "reason", "") or ""
    if kind in ("failed", "disabled"):
        return f"{kind}: {reason}" if reason else kind
    if kind == "stand down" and reason.startswith("upstream shape changed"):
        return f"stand down: {reason}"
    return None


def _decisions() -> dict:
    from shim.engine import registry

    return registry.decisions()


def not_running_reason(patch_id: str, decisions: "dict | None" = None) -> "str | None":
    """Why the verify record ``patch_id`` is asked for (``SHIM_VERIFY_WEIGHTS`` on) but checks
    nothing in this process, or None (running, not asked for, or not this release's record).
    ``python -m shim status`` shows it as ``requested, not running: <why>``."""
    if not patch_id.startswith("verify-weights") or not requested():
        return None
    decisions = _decisions() if decisions is None else decisions
    own = decisions.get(patch_id)
    mine = _down(own)
    if mine:
        return f"{patch_id} {mine}"
    if getattr(own, "decision", "") != "applied":
        return None
    if patch_id != VLLM_RECORD and not patch_id.startswith(SELF_CHECKING):
        partner = _down(decisions.get(VLLM_RECORD))
        if partner:
            return f"its engine half {VLLM_RECORD} {partner}: no check runs before LLM.generate/chat"
    with _lock:
        engines = dict(_reasons)
    if engines:
        return "; ".join(f"{name}: {why}" for name, why in sorted(engines.items()))
    return None


def _trainer_half_down(decisions: dict) -> "str | None":
    for pid, d in sorted(decisions.items()):
        if pid.startswith("verify-weights-") and pid != VLLM_RECORD and not pid.startswith(NOT_TRL):
            why = _down(d)
            if why:
                return f"{pid} {why}"
    return None


def cannot_verify(engine: str, why: str) -> None:
    """Note that ``engine`` cannot be verified in this process (``status``: ``requested, not running: <why>``)."""
    with _lock:
        _reasons.setdefault(engine, why)


def unverifiable(llm, target: "Target | None", why: str) -> None:
    """One rollout that was asked to be verified and was not: counted; one WARNING per reason.

    Never silently off: when verification is asked for and an engine or trainer cannot be
    verified (a verify record standing down or failed, a trainer model that cannot be
    compared, an engine none of whose tensors maps to a trainer tensor, an engine in another process that
    cannot run the check), the process logs one WARNING naming why, every such rollout counts
    as ``rollouts_unverifiable``, and :func:`not_running_reason` gives the reason to
    ``python -m shim status`` (``requested, not running: <why>``).
    """
    name = engine_name(llm) if llm is not None else "?"
    record("unverifiable")
    warn_once(why, f"verify-weights {name}{f' ({target.site})' if target else ''}: verification requested "
                    f"({config.SHIM_VERIFY_WEIGHTS}={os.environ.get(config.SHIM_VERIFY_WEIGHTS, '')}) but "
                    f"not running: {why}; these rollouts count as shim/rollouts_unverifiable")


# ---------------------------------------------------------------------------
# per engine: what it must equal, and the check
# ---------------------------------------------------------------------------
class Target:
    """One colocated engine's verification: the trainer model it must equal while armed."""

    def __init__(self, site: str):
        self.site = site
        self.model_ref = None
        self.armed = 0
        self.reached = 0           # before_generate calls while armed (an armed window without one: unverified)
        self.descs = None          # rank -> describe()
        self.mapped = None         # engine names compared (every worker holds the same names)
        self.mode = None
        self.disabled = ""         # why this engine cannot be verified
        self.checks = 0            # checks made (the sample window's position)
        self.generates = 0
        self.stale = 0
        self.params = None         # the trainer's parameters by pushed name
        self.source = None         # model -> (tensors by pushed name, why not): what a push gives (PEFT: merged)
        self.views = None          # compare.Views of the trainer's pieces (made again when described again)
        self.skipped = []          # engine tensors left out: "name (why)" (quantized, unmapped)
        self.stale_pairs = None    # (rank, engine name) that differed at the last check (None: not compared)

    def model(self):
        return self.model_ref() if self.model_ref is not None else None


def target_for(llm, create: bool = False, site: str = "") -> "Target | None":
    key = transport.vllm_engine(llm)
    with _lock:
        try:
            t = _targets.get(key)
            if t is None and create:
                t = _targets[key] = Target(site)
        except TypeError:
            return None
    return t


class armed:
    """``with armed(llm, model, site, source):`` around a trainer's generate: the engine must equal ``model``.

    ``source``: ``model -> (tensors by pushed name, None)`` for a model whose push gives the engine other
    tensors than its parameters (a PEFT model: the adapter merged, ``shim.peft.merge.verified_tensors``),
    ``(None, why)`` where those cannot be reproduced, ``(None, None)`` to read the model's parameters.
    A window in which no check reached the engine (its vLLM half not applied, or the trainer
    sampled through another path) is one unverifiable rollout.

    How it is wired (explicit per-engine objects, no thread-locals): a trainer-side wrapper
    (``patches/verify_weights.py``) calls :class:`armed` around the trainer's own generate method: it
    names the trainer model the engine must equal (a :class:`Target`, kept per engine like
    ``shim.vllm.sleep.sleep_state``); the vLLM side is :func:`before_generate`.
    """

    def __init__(self, llm, model, site: str, source=None):
        self.target = None
        self.llm = llm
        if llm is None or model is None:
            return
        self.target = target_for(llm, create=True, site=site)
        if self.target is not None:
            self.target.site = site
            self.target.source = source
            try:
                self.target.model_ref = weakref.ref(model)
            except TypeError:
                self.target.model_ref = lambda m=model: m

    def __enter__(self):
        if self.target is not None:
            self.target.armed += 1
            self._reached = self.target.reached
        return self.target

    def __exit__(self, exc_type, *exc):
        t = self.target
        if t is None:
            return False
        t.armed -= 1
        if t.armed == 0 and exc_type is None and t.reached == self._reached and requested():
            down = _down(_decisions().get(VLLM_RECORD))
            unverifiable(self.llm, t, f"its engine half {VLLM_RECORD} {down}: no check runs before LLM.generate/chat"
                         if down else "no LLM.generate/chat reached the engine while the trainer generated")
        return False


engine_name = transport.engine_name


def trainer_step() -> "int | None":
    """The global step of the transformers ``Trainer`` up the call stack."""
    frame = sys._getframe(1)
    for _ in range(60):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        step = getattr(getattr(owner, "state", None), "global_step", None)
        if isinstance(step, int):
            return step
        frame = frame.f_back
    return None


def before_generate(llm) -> None:
    """Called by the ``LLM.generate``/``chat`` wrapper: verify when a trainer armed this engine.

    A vLLM-side wrapper (``vllm.LLM.generate`` / ``chat``) calls this: when its engine is armed, it
    verifies. It runs INSIDE every other wrapper the trainer or the shim put around the engine
    (``shim.trl.synced_llm`` pushes first), so it sees exactly the weights vLLM is about to sample from.

    Per tensor, never per engine: engine tensors that map to no trainer tensor or hold quantized values
    (:func:`shim.verify.layout.quantized`) are left out one by one, said once with their reasons; a check
    that finds every other tensor equal is ``partly_verified``, never ``verified``, and the verified share
    of the engine's bytes (:func:`shim.verify.layout.share`) is in the ``verify`` trace record (``share``,
    ``skipped``), ``python -m shim report`` and the trainer's metrics (``shim/verified_share``, the last
    check's).
    """
    mode = requested()
    if not mode:
        return
    target = target_for(llm)
    if target is None or target.armed <= 0:
        down = _trainer_half_down(_decisions())
        if down:  # a trainer generates here, unarmed: its arming record could not apply
            unverifiable(llm, None, f"{down}: this engine is never armed")
        return
    target.reached += 1
    if target.disabled:
        unverifiable(llm, target, target.disabled)
        return
    t0 = time.perf_counter()
    try:
        differ = check.verify(llm, target, mode)
    except StaleWeights:
        raise
    except Exception as exc:  # the check must never stop training
        target.disabled = (str(exc) if isinstance(exc, transport.Unreachable)
                           else f"the check failed ({type(exc).__name__}: {exc})")
        with _lock:
            _reasons.setdefault(engine_name(llm), target.disabled)
        unverifiable(llm, target, target.disabled)
        return
    seconds = time.perf_counter() - t0
    if differ is None:
        if target.disabled:
            with _lock:
                _reasons.setdefault(engine_name(llm), target.disabled)
        unverifiable(llm, target, target.disabled or "the trainer model is gone")
        return
    target.generates += 1
    step = trainer_step()
    share = check.share(target, differ)
    if not differ:
        verdict = "partly_verified" if target.skipped else "verified"
        record(verdict, seconds, share)
        version = _tag(llm, step)
        _trace(llm, target, mode, verdict.replace("_", " "), step, version, [], seconds, share)
        if log.debugging():
            log.debug(f"verify-weights {engine_name(llm)}: weights equal the trainer's at step "
                      f"{'?' if step is None else step} (weight version {version or '-'}; {mode}, "
                      f"{len(target.mapped) if mode == config.VERIFY_EXACT else compare.TENSORS} tensors, "
                      f"{seconds * 1e3:.2f} ms)")
        return
    target.stale += 1
    record("stale", seconds, share)
    version = transport.weight_version(llm)
    _trace(llm, target, mode, "stale", step, version, differ, seconds, share)
    _report_stale(llm, target, differ, mode, step, version)


def _tag(llm, step) -> "str | None":
    """Tag the engine with the step its weights were just proven equal to (vLLM >= 0.27.0).

    Weight version: where vLLM has ``LLMEngine.set_weight_version`` (0.27.0 and later), a
    check that finds the engine equal to the trainer tags the engine with the trainer's global
    step (vLLM stamps its outputs with it); the verification line and the ``verify`` trace
    record (``SHIM_TRACE``) name the engine's version.
    """
    if step is None:
        return transport.weight_version(llm)
    try:
        if transport.set_weight_version(llm, str(step)):
            return str(step)
    except Exception as exc:  # a tag is informative only
        log.debug(f"verify-weights: set_weight_version failed: {exc!r}")
    return None


def _trace(llm, target, mode, verdict, step, version, differ, seconds, share=None) -> None:
    report.trace(engine_name(llm), target.site, mode, verdict, step, version, differ, seconds, share, target.skipped)


def _report_stale(llm, target: Target, differ: list, mode: str, step, version) -> None:
    report_stale(engine_name(llm), target.site, differ, mode, step, version, target.stale, target.generates,
                 "the engine is about to generate from weights that differ from the trainer's", "generates",
                 check.LORA_ONLY if check.lora_only(target, differ) else "")
