"""Weight verification (``SHIM_VERIFY_WEIGHTS``): arming, the check before each generate, and what it reports.

Whatever the cause of a missing push (an upstream bug, a patch switched off or standing
down, a new trainer release, a push that misses one tensor), a colocated engine that
samples from other weights than the trainer holds produces rollouts of the wrong policy
without any error. With ``SHIM_VERIFY_WEIGHTS=1`` the shim compares, right before vLLM
samples, exact digests of the engine's weights with the trainer's current weights
(:mod:`shim.verify.digest`, computed where the tensors live); on a mismatch it logs one
WARNING with the words ``stale weights`` (the engine, the trainer's step, the engine's
weight version, the first tensors that differ), or raises :class:`StaleWeights` with
``SHIM_STRICT=1``.

How it is wired (explicit per-engine objects, no thread-locals):

- A trainer-side wrapper (``patches/verify_weights.py``) calls :class:`armed` around the
  trainer's own generate method: it names the trainer model the engine must equal (a
  :class:`Target`, kept per engine like ``shim.vllm.sleep.sleep_state``).
- A vLLM-side wrapper (``vllm.LLM.generate`` / ``chat``) calls :func:`before_generate`:
  when its engine is armed, it verifies. It runs INSIDE every other wrapper the trainer or
  the shim put around the engine (``shim.trl.synced_llm`` pushes first), so it sees exactly
  the weights vLLM is about to sample from.

Modes: ``exact`` (``1``, the default: every mapped tensor at every check) and ``sample``
(:data:`shim.verify.compare.TENSORS` tensors per check, a different slice each time, so every
mapped tensor is compared within ``ceil(mapped / TENSORS)`` consecutive checks; of each about
:data:`shim.verify.compare.ELEMENTS` elements in strided rows, the first row moving on each pass).

Never silently off: when verification is asked for and an engine or trainer cannot be
verified (a verify record standing down or failed, a trainer model that cannot be
compared, an engine none of whose tensors maps to a trainer tensor, an engine in another process that
cannot run the check), the process logs one WARNING naming why, every such rollout counts
as ``rollouts_unverifiable``, and :func:`not_running_reason` gives the reason to
``python -m shim status`` (``requested, not running: <why>``).

Weight version: where vLLM has ``LLMEngine.set_weight_version`` (0.27.0 and later), a
check that finds the engine equal to the trainer tags the engine with the trainer's global
step (vLLM stamps its outputs with it); the verification line and the ``verify`` trace
record (``SHIM_TRACE``) name the engine's version.

Per tensor, never per engine: engine tensors that map to no trainer tensor or hold quantized values
(:func:`shim.verify.layout.quantized`) are left out one by one, said once with their reasons; a check that
finds every other tensor equal is ``partly_verified``, never ``verified``, and the verified share of the
engine's bytes (:func:`shim.verify.layout.share`) is in the ``verify`` trace record (``share``, ``skipped``),
``python -m shim report`` and the trainer's metrics (``shim/verified_share``, the last check's).

Counts (:func:`counts`): ``verified``, ``partly_verified``, ``stale``, ``unverifiable``, ``seconds`` (the shim's
own time in verification), ``times``; also ``shim.observe.events.count("rollouts_<verdict>")``.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref

from shim.engine import config, log
from shim.verify import compare, layout, transport

WARN_FIRST = 5
"""Stale generates logged one WARNING each; after that one WARNING every :data:`WARN_EVERY`."""
WARN_EVERY = 50
SHOW = 3
"""Tensors named in a WARNING."""
VLLM_RECORD = "verify-weights-vllm"
"""The engine half: the check before ``LLM.generate``/``chat`` (ms-swift's records check on their own)."""
NOT_TRL = ("verify-weights-verl", "verify-weights-vllm-worker")
"""Record id prefixes of verl's verification (``shim.verl.verify_weights``: the trainer half, the rollout
server's and the vLLM worker's parts): no TRL-style arming, never the partner of :data:`VLLM_RECORD`."""
SELF_CHECKING = ("verify-weights-swift", *NOT_TRL)
"""Record id prefixes that run the check themselves (not through :data:`VLLM_RECORD`)."""


class StaleWeights(RuntimeError):
    """Raised with SHIM_STRICT=1: the engine was about to sample from other weights than the trainer's."""


_lock = threading.Lock()
_counts = {"verified": 0, "partly_verified": 0, "stale": 0, "unverifiable": 0, "seconds": 0.0}
_read: dict = {}       # bytes one exact check reads: {"engine": ..., "trainer": ...} (the bench's floor)
_times: list = []      # the shim's own seconds per verification (bench: median cost per generate)
_targets: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_warned: set = set()   # reasons already said (one WARNING per process each)
_reasons: dict = {}    # engine name -> why it cannot be verified (this process)


def counts() -> dict:
    with _lock:
        out = dict(_counts)
        out["times"] = list(_times)
        out["bytes_per_exact_check"] = dict(_read)
        return out


def reset() -> None:
    """Forget what was said and why engines were unverifiable (tests)."""
    with _lock:
        _warned.clear()
        _reasons.clear()


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


def requested() -> str:
    """The ``SHIM_VERIFY_WEIGHTS`` mode asked for (``exact``/``sample``), or ``""`` (off or a bad value)."""
    return config.verify_weights()


def warn_once(reason: str, message: str) -> None:
    with _lock:
        if reason in _warned:
            log.debug(message)
            return
        _warned.add(reason)
    log.warning(message)


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
    """One rollout that was asked to be verified and was not: counted; one WARNING per reason."""
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
    sampled through another path) is one unverifiable rollout."""

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


def engine_name(llm) -> str:
    from shim.vllm.sleep import sleep_state

    return sleep_state.engine_name(transport.vllm_engine(llm))


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
    """Called by the ``LLM.generate``/``chat`` wrapper: verify when a trainer armed this engine."""
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
        differ = _verify(llm, target, mode)
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
    share = _share(target, differ)
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
    """Tag the engine with the step its weights were just proven equal to (vLLM >= 0.27.0)."""
    if step is None:
        return transport.weight_version(llm)
    try:
        if transport.set_weight_version(llm, str(step)):
            return str(step)
    except Exception as exc:  # a tag is informative only
        log.debug(f"verify-weights: set_weight_version failed: {exc!r}")
    return None


def _share(target: Target, differ: list) -> float:
    """The verified share of the engine's bytes at this check: the mapped tensors, less those that differ
    (every one when the check could not name them, e.g. weights asleep)."""
    names = target.mapped if target.stale_pairs is not None or not differ else ()
    verified, total = layout.share(target.descs or {}, names, target.stale_pairs or ())
    return verified / total if total else 0.0


def _trace(llm, target, mode, verdict, step, version, differ, seconds, share=None) -> None:
    path = config.trace_path()
    if not path:
        return
    from shim.observe import events

    rec = {"v": events.SCHEMA, "event": "verify", "t": time.time(), "seconds": seconds, "rank": log.rank(),
           "local_rank": log.local_rank(), "pid": os.getpid(), "host": events.host(),
           "engine": engine_name(llm), "site": target.site, "mode": mode, "verdict": verdict, "step": step,
           "weight_version": version, "differing": differ[:SHOW], "share": None if share is None else round(share, 4),
           "skipped": target.skipped[:SHOW], "skipped_count": len(target.skipped)}
    try:
        events.write_trace(path, rec)
    except OSError as exc:
        warn_once(f"trace {path}", f"{config.SHIM_TRACE}={path}: cannot append: {exc}")


def _verify(llm, target: Target, mode: str) -> "list | None":
    model = target.model()
    target.stale_pairs = None
    if model is None:
        return None
    if transport.weights_asleep(llm):
        return ["(all: the engine's weights are asleep at generate)"]
    if target.descs is None or target.mode != mode:
        if not _prepare(llm, target, model, mode):
            return None
    exact = mode == config.VERIFY_EXACT
    names = target.mapped if exact else compare.window(target.mapped, target.checks)
    spec = None if exact else compare.sample(target.checks, len(target.mapped))
    target.checks += 1
    results = transport.run_on_workers(llm, {"names": names, "sample": spec})
    target.stale_pairs = set()
    return compare.compare(results, target.descs, names, target.params, spec, target.views, target.stale_pairs)


def _prepare(llm, target: Target, model, mode: str) -> bool:
    """Describe the engine once: which tensors are compared; say what cannot be."""
    name = engine_name(llm)
    params, reason = target.source(model) if target.source is not None else (None, None)
    if params is None:
        reason = reason or layout.unverifiable_reason(model)
    if reason:
        target.disabled = f"the trainer model cannot be compared: {reason}"
        return False
    results = transport.run_on_workers(llm, {"describe": True})
    target.descs = {r["rank"]: r["describe"] for r in results}
    if params is None:
        params = layout.trainer_params(model)
    first = target.descs[min(target.descs)]
    good, bad = layout.mapped(first, params)
    for rank, desc in target.descs.items():  # every worker holds the same names (its own shards)
        ok, _ = layout.mapped(desc, params)
        bad += [f"{n} (not mapped on tp rank {rank})" for n in good if n not in set(ok)]
        good = [n for n in good if n in set(ok)]
    target.mode, target.params, target.mapped, target.checks = mode, params, good, 0
    target.skipped = bad
    target.views = compare.Views()
    _note_bytes(target.descs, good, params)
    total = len(first["params"])
    if not good:
        target.disabled = f"no engine tensor maps to a trainer tensor (of {total}; e.g. {', '.join(bad[:SHOW])})"
        return False
    if bad:
        verified, size = layout.share(target.descs, good)
        warn_once(f"unmapped {name}", f"verify-weights {name}: {len(bad)} of {total} engine tensors are not "
                                       f"verified (quantized, or mapping to no trainer tensor), "
                                       f"{100 * verified / max(size, 1):.1f}% of the engine's bytes are: "
                                       f"{', '.join(bad[:SHOW])}{' ...' if len(bad) > SHOW else ''}; checks that find "
                                       "the rest equal count as shim/rollouts_partly_verified, never verified")
    if mode == config.VERIFY_EXACT:
        what = "every mapped tensor at every check"
    else:
        per = min(compare.TENSORS, len(good))
        what = (f"{per} tensors per check (~{compare.ELEMENTS} elements each, strided rows), rotating: each "
                f"within {math.ceil(len(good) / per)} consecutive checks")
    log.info(f"verify-weights {name} ({target.site}): comparing {len(good)} of {total} engine tensors with the "
             f"trainer's before each generate ({mode}: {what}; exact digests on the device; "
             f"{len(target.descs)} worker(s), {transport.where(llm)})")
    return True


def _note_bytes(descs: dict, names: list, params: dict) -> None:
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


LORA_ONLY = ("Only tensors with a LoRA adapter merged into them differ: the engine holds other merged weights than "
             "the trainer's base plus adapter give now -- a merged tensor not pushed, or the frozen base moved by "
             "upstream's in-place merge/unmerge after the push (trl-lora-merge-drift* / swift-lora-merge-drift* "
             "switched off or not covering this trainer). ")


def _lora_only(target: Target, differ: list) -> bool:
    """Every differing engine tensor holds a LoRA-merged trainer tensor (``params.derived``)."""
    derived = getattr(target.params, "derived", None)
    if not derived or not differ or not target.descs:
        return False
    desc = target.descs[min(target.descs)]["params"]
    for name in differ:
        d = desc.get(name.split(" (")[0])
        if d is None or not any(piece[0] in derived for piece in d["layout"]["pieces"]):
            return False
    return True


def _report_stale(llm, target: Target, differ: list, mode: str, step, version) -> None:
    report_stale(engine_name(llm), target.site, differ, mode, step, version, target.stale, target.generates,
                 "the engine is about to generate from weights that differ from the trainer's", "generates",
                 LORA_ONLY if _lora_only(target, differ) else "")


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
