"""Which tensors to compare at a check, their digests on both sides, and which differ.

Both sides go through :mod:`shim.verify.digest` where their tensors live: the engine's pieces (its own dtype)
on each worker, the trainer's matching slices rounded to the engine's dtype (what the push's ``param.copy_``
does: float32 master weights and a bf16 engine compare equal) on the trainer's device. Only the digests
(``COLS`` integers per piece) cross devices and processes.

``exact``: every mapped tensor at every check; ``sample``: :data:`TENSORS` of them per check (:func:`window`,
:func:`rows`). Sharded trainers: under DeepSpeed ZeRO-3 the trainer tensors of one engine tensor are gathered
at a time (``deepspeed.zero.GatheredParameters``, a collective: every rank verifies the same tensors at the
same generate); FSDP2 ``DTensor`` parameters through ``full_tensor()`` (likewise): :class:`Gathered`.
"""
from __future__ import annotations

import contextlib
import weakref

from shim.verify import digest, layout

TENSORS = 8
"""Tensors compared per check in ``sample`` mode."""
ELEMENTS = 1 << 16
"""Elements compared per tensor in ``sample`` mode (whole leading-dimension rows, at least one)."""


class Views:
    """Views of tensors kept from one check to the next (a check has hundreds of pieces; a ``narrow``
    per piece costs more than the digest kernel's share): one is made again when its tensor is no longer
    the object, address, shape and dtype it was made from (a parameter replaced or re-pointed)."""

    def __init__(self):
        self._kept: dict = {}

    def get(self, key, tensor, make):
        sig = (id(tensor), tensor.data_ptr(), tensor.shape, tensor.dtype)
        got = self._kept.get(key)
        if got is not None and got[0] == sig:
            return got[1]
        view = make()
        self._kept[key] = (sig, view)
        return view


def rows(view, elements: int, phase: int):
    """Rows ``phase % stride, + stride, ...`` of ``view``'s leading dimension (a view): about
    ``elements`` elements, ``stride = ceil(rows / (elements // row size))``."""
    if view.dim() == 0 or view.shape[0] <= 1:
        return view
    per_row = max(1, view.numel() // view.shape[0])
    take = max(1, elements // per_row)
    stride = -(-view.shape[0] // take)
    return view[phase % stride::stride] if stride > 1 else view


def sample(check: int, mapped: int, per: "int | None" = None) -> list:
    """The ``sample`` request of check number ``check``: ``[elements, phase]`` (the phase is the
    number of whole passes over the slices before it)."""
    per = TENSORS if per is None else per
    return [ELEMENTS, check // max(1, -(-mapped // per))]


def window(mapped: list, check: int, per: "int | None" = None) -> list:
    """The names of check number ``check`` (0, 1, ...): ``per`` consecutive names, the next
    ``per`` at the next check, wrapping, so any ``ceil(len(mapped) / per)`` consecutive
    checks cover every name.

    ``sample`` mode: :data:`TENSORS` names per check, a different slice each time: every mapped tensor is
    compared within ``ceil(mapped / TENSORS)`` consecutive checks; of each, about :data:`ELEMENTS`
    elements: evenly strided rows of its leading dimension (:func:`rows`), the starting row moving on by
    one at each pass over the slices, so repeated passes cover every row.
    """
    per = TENSORS if per is None else per
    n = len(mapped)
    if n <= per:
        return list(mapped)
    start = (check * per) % n
    return [mapped[(start + k) % n] for k in range(per)]


def _dtype(name: str):
    import torch

    return getattr(torch, name)


# ---------------------------------------------------------------------------
# engine side (inside each worker)
# ---------------------------------------------------------------------------
def fingerprint(model, request: dict) -> dict:
    """Run on one worker: ``request = {"describe": bool, "names": [...], "sample": None or
    [elements, phase]}``.

    ``describe``: this worker's :func:`shim.verify.layout.describe` (made afresh); ``digests``: for
    each name, one digest per layout piece (lists of ints); ``lora`` (``{"id": ...}``): that adapter of vLLM's
    LoRA manager, :func:`shim.verify.lora.engine_digests`."""
    names = request.get("names") or []
    desc, params, kept = described(model, fresh=bool(request.get("describe")))
    out = {"rank": desc["rank"]}
    if request.get("describe"):
        out["describe"] = desc
    if request.get("lora") is not None:  # an adapter in vLLM's LoRA manager (shim.verify.lora)
        from shim.verify import lora

        out["lora"] = lora.engine_digests(model, request["lora"])
    if not names:
        return out
    spec = request.get("sample")
    views, owners = [], []
    for name in names:
        p, lay = params[name], desc["params"][name]["layout"]
        pieces = kept.get(name, p, lambda p=p, lay=lay: layout.engine_views(p, lay))
        views.extend(rows(v, *spec) if spec else v for v in pieces)
        owners.append(len(pieces))
    flat = digest.digests(views)
    out["digests"], pos = [], 0
    for n in owners:
        out["digests"].append(flat[pos:pos + n])
        pos += n
    return out


_described = weakref.WeakKeyDictionary()  # engine model -> (describe(), slots, Views of its pieces)


def described(model, fresh: bool = False) -> "tuple[dict, dict, Views]":
    """``(layout.describe(model), {name: parameter}, Views of its pieces)`` of an engine model, kept
    from one check to the next while every parameter is still the object, shape and dtype it was described with (vLLM loads
    pushed and reloaded weights into the same tensors). A parameter replaced (``module.weight = ...``)
    or re-pointed (``param.data = ...`` of another shape or dtype) makes a new description. Only weak
    references are kept: a replaced parameter or a finished engine frees its memory as before."""
    got = None if fresh else _described.get(model)
    if got is not None:
        desc, slots, kept = got
        params = {}
        for name, mref, leaf, pref, shape, dtype in slots:
            mod, p = mref(), pref()
            if p is None or mod is None or mod._parameters.get(leaf) is not p or p.shape != shape or p.dtype != dtype:
                break
            params[name] = p
        else:
            return desc, params, kept
    desc, kept = layout.describe(model), Views()
    slots, params, seen = [], {}, set()
    for prefix, mod in model.named_modules():  # named_parameters()'s names and order (a tied parameter once)
        for leaf, p in mod._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{prefix}.{leaf}" if prefix else leaf
            params[name] = p
            slots.append((name, weakref.ref(mod), leaf, weakref.ref(p), p.shape, p.dtype))
    try:
        _described[model] = (desc, slots, kept)
    except TypeError:  # not weak-referenceable: described at every check
        pass
    return desc, params, kept


# ---------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------
class Gathered:
    """Full trainer tensors for the names given: ZeRO-3 gathered, FSDP2 DTensor made whole, a derived tensor
    (``params.derived``, e.g. a LoRA base weight with its adapter merged: ``shim.peft.merge.Merged``) made."""

    def __init__(self, params: dict, names):
        self.params = params
        self.names = list(dict.fromkeys(names))
        self._ctx = None
        self.sharded = False
        """True where a tensor was gathered or made whole for the context only (freed on exit)."""

    def __enter__(self) -> dict:
        sharded = [self.params[n] for n in self.names if hasattr(self.params[n], "ds_id")]
        self.sharded = bool(sharded) or any(callable(getattr(self.params[n], "full_tensor", None)) for n in self.names)
        if sharded:
            import deepspeed

            self._ctx = deepspeed.zero.GatheredParameters(sharded, modifier_rank=None)
            self._ctx.__enter__()
        out = {}
        derived = getattr(self.params, "derived", None) or {}
        for n in self.names:
            if n in derived:
                out[n] = self.params.derive(n).detach()
                continue
            p = self.params[n]
            full = getattr(p, "full_tensor", None)  # FSDP2 DTensor (collective)
            out[n] = (full() if callable(full) else p).detach()
        return out

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


def _sharded(t) -> bool:
    return hasattr(t, "ds_id") or callable(getattr(t, "full_tensor", None))


def _made(params: dict, name: str) -> bool:
    """Read through :class:`Gathered` (a whole tensor made for the check and freed after it): sharded or derived."""
    return name in (getattr(params, "derived", None) or ()) or _sharded(params[name])


def trainer_digests(desc: dict, names: list, params: dict, spec=None, kept: "Views | None" = None) -> list:
    """What :func:`fingerprint` must return for ``names`` (and the ``sample`` request ``spec``)
    on the worker ``desc`` describes, computed from the trainer's tensors (one digest per
    piece, per name; the ZeRO-3 / FSDP2 tensors of one name gathered at a time, the others read
    as they are, their views kept in ``kept`` from one check to the next)."""
    import torch

    parts, owners, views, dtypes = [], [], [], []
    with torch.no_grad():
        for name in names:
            d = desc["params"][name]
            lay, dtype = d["layout"], _dtype(d["dtype"])
            pieces = lay["pieces"]
            sharded = any(_made(params, piece[0]) for piece in pieces)
            with Gathered(params, [piece[0] for piece in pieces]) if sharded else contextlib.nullcontext(params) \
                    as tensors:
                for k, piece in enumerate(pieces):
                    t = tensors[piece[0]]
                    if not lay.get("scalar") and (t.dim() <= lay["dim"] or piece[3] + piece[2] > t.shape[lay["dim"]]):
                        raise LookupError(f"{piece[0]}: trainer shape {list(t.shape)} does not hold rows "
                                          f"{piece[3]}..{piece[3] + piece[2]} of dim {lay['dim']}")
                    if kept is None or sharded:
                        view = layout.trainer_view(t, lay, piece)
                    else:
                        view = kept.get((desc.get("rank"), name, k), t,
                                        lambda t=t, piece=piece: layout.trainer_view(t, lay, piece))
                    views.append(rows(view, *spec) if spec else view)
                    dtypes.append(dtype)
                if sharded:  # gathered tensors are freed on exit: digest them first
                    parts += digest.partials_many(views, dtypes)
                    views, dtypes = [], []
            owners.append(len(pieces))
        parts += digest.partials_many(views, dtypes)  # all unsharded pieces together (one launch per kind)
    flat = digest.collect(parts)
    out, pos = [], 0
    for n in owners:
        out.append(flat[pos:pos + n])
        pos += n
    return out


def slots(lay: dict, got, want) -> str:
    """`` (experts.3.up_proj.weight, ...)``: the trainer tensors of a fused experts parameter whose slices
    differ (its pieces carry a slot), so a wrong expert is named; ``""`` for any other layout."""
    pieces = lay["pieces"] if lay else []
    if not pieces or len(pieces[0]) < 5 or len(got) != len(want):
        return ""
    bad = [p[0] for p, a, b in zip(pieces, got, want) if a != b]
    tails = [".".join(n.split(".")[-4:]) for n in bad[:3]]
    return f" ({', '.join(tails)}{' ...' if len(bad) > 3 else ''})" if tails else ""


def compare(results: list, descs: dict, names: list, params: dict, spec=None, kept: "Views | None" = None,
            stale: "set | None" = None) -> list:
    """Tensors (``"name (tp rank r)"``; fused experts also name the differing experts) whose digests differ
    from the trainer's, on every worker (``spec``: the ``sample`` request the workers were given); ``stale``:
    a set given gets ``(rank, name)`` of each."""
    differ = []
    for r in results:
        rank = r["rank"]
        tag = f" (tp rank {rank})" if len(results) > 1 or rank else ""
        want = trainer_digests(descs[rank], names, params, spec, kept)
        got = r.get("digests") or []
        if len(got) != len(want):
            got = [None] * len(want)
        for n, a, b in zip(names, got, want):
            if a != b:
                differ.append(n + tag + slots(descs[rank]["params"][n]["layout"], a or [], b))
                if stale is not None:
                    stale.add((rank, n))
    return differ
