"""One check of an armed engine: describe it once (which engine tensors map to which trainer tensors, what is left
out and why), then compare the digests of every mapped tensor (``exact``) or of a rotating slice (``sample``) with
the trainer's; a LoRA adapter in vLLM's own LoRA manager is compared too (:mod:`shim.verify.lora`).

Called by :func:`shim.verify.weights.before_generate` with its per-engine :class:`shim.verify.weights.Target`.
"""
from __future__ import annotations

import math

from shim.engine import config, log
from shim.verify import compare, layout, report, transport
from shim.verify.report import SHOW, warn_once


def share(target, differ: list) -> float:
    """The verified share of the engine's bytes at this check: the mapped tensors, less those that differ
    (every one when the check could not name them, e.g. weights asleep)."""
    names = target.mapped if target.stale_pairs is not None or not differ else ()
    verified, total = layout.share(target.descs or {}, names, target.stale_pairs or ())
    return verified / total if total else 0.0


def verify(llm, target, mode: str) -> "list | None":
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
    adapter = getattr(target.params, "adapter", None)  # vLLM's own LoRA: the adapter in its LoRA manager too
    request = {"names": names, "sample": spec, **({"lora": {"id": None}} if adapter is not None else {})}
    results = transport.run_on_workers(llm, request)
    target.stale_pairs = set()
    differ = compare.compare(results, target.descs, names, target.params, spec, target.views, target.stale_pairs)
    if adapter is not None:
        from shim.verify import lora

        differ += lora.compare(results, adapter())
    return differ


def _prepare(llm, target, model, mode: str) -> bool:
    """Describe the engine once: which tensors are compared; say what cannot be."""
    name = transport.engine_name(llm)
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
    report.note_bytes(target.descs, good, params)
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
    lora = " and the LoRA adapter in vLLM's LoRA manager (every tensor)" if hasattr(params, "adapter") else ""
    log.info(f"verify-weights {name} ({target.site}): comparing {len(good)} of {total} engine tensors{lora} with "
             f"the trainer's before each generate ({mode}: {what}; exact digests on the device; "
             f"{len(target.descs)} worker(s), {transport.where(llm)})")
    return True


LORA_ONLY = ("Only tensors with a LoRA adapter merged into them differ: the engine holds other merged weights than "
             "the trainer's base plus adapter give now -- a merged tensor not pushed, or the frozen base moved by "
             "upstream's in-place merge/unmerge after the push (trl-lora-merge-drift* / swift-lora-merge-drift* "
             "switched off or not covering this trainer). ")


def lora_only(target, differ: list) -> bool:
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


