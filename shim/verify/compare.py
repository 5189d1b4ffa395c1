"""Which tensors to compare at a check, their digests on both sides, and which differ.

Both sides go through :mod:`shim.verify.digest` where their tensors live: the engine's
pieces (its own dtype) on each worker, the trainer's matching slices rounded to the
engine's dtype (what the push's ``param.copy_`` does: float32 master weights and a bf16
engine compare equal) on the trainer's device. Only the digests (``COLS`` integers per
piece) cross devices and processes.

``exact``: every mapped tensor at every check. ``sample``: :data:`TENSORS` of them per
check, a different slice each time (:func:`window`): every mapped tensor is compared
within ``ceil(mapped / TENSORS)`` consecutive checks.

Sharded trainers: under DeepSpeed ZeRO-3 the trainer tensors of one packing buffer are
gathered at a time (``deepspeed.zero.GatheredParameters``, a collective: every rank
verifies the same tensors at the same generate); FSDP2 ``DTensor`` parameters through
``full_tensor()`` (likewise).
"""
from __future__ import annotations

from shim.verify import digest, layout

TENSORS = 8
"""Tensors compared per check in ``sample`` mode (whole tensors, every element)."""


def window(mapped: list, check: int, per: "int | None" = None) -> list:
    """The names of check number ``check`` (0, 1, ...): ``per`` consecutive names, the next
    ``per`` at the next check, wrapping, so any ``ceil(len(mapped) / per)`` consecutive
    checks cover every name."""
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
    """Run on one worker: ``request = {"describe": bool, "names": [...]}``.

    ``describe``: this worker's :func:`shim.verify.layout.describe`; ``digests``: for each
    name, one digest per layout piece (lists of ints)."""
    out = {"rank": layout.tp_rank(model)}
    desc = layout.describe(model) if request.get("describe") or request.get("names") else None
    if request.get("describe"):
        out["describe"] = desc
    names = request.get("names") or []
    if not names:
        return out
    params = dict(model.named_parameters())
    views, owners = [], []
    for name in names:
        pieces = layout.engine_views(params[name], desc["params"][name]["layout"])
        views.extend(pieces)
        owners.append(len(pieces))
    flat = digest.digests(views)
    out["digests"], pos = [], 0
    for n in owners:
        out["digests"].append(flat[pos:pos + n])
        pos += n
    return out


# ---------------------------------------------------------------------------
# trainer side
# ---------------------------------------------------------------------------
class Gathered:
    """Full trainer tensors for the names given: ZeRO-3 gathered, FSDP2 DTensor made whole."""

    def __init__(self, params: dict, names):
        self.params = params
        self.names = list(dict.fromkeys(names))
        self._ctx = None

    def __enter__(self) -> dict:
        sharded = [self.params[n] for n in self.names if hasattr(self.params[n], "ds_id")]
        if sharded:
            import deepspeed

            self._ctx = deepspeed.zero.GatheredParameters(sharded, modifier_rank=None)
            self._ctx.__enter__()
        out = {}
        for n in self.names:
            p = self.params[n]
            full = getattr(p, "full_tensor", None)  # FSDP2 DTensor (collective)
            out[n] = (full() if callable(full) else p).detach()
        return out

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
        return False


class _Slices:
    """``fetch`` for :meth:`shim.verify.digest.Plan.run`: the trainer slices of some pieces."""

    def __init__(self, params: dict, pieces: list, idx: list):
        self.pieces = [pieces[i] for i in idx]
        self.idx = idx
        self.gathered = Gathered(params, [p[0] for p in self.pieces])

    def __enter__(self) -> dict:
        tensors = self.gathered.__enter__()
        out = {}
        for i, (tname, lay, piece) in zip(self.idx, self.pieces):
            t = tensors[tname]
            if not lay.get("scalar") and (t.dim() <= lay["dim"] or piece[3] + piece[2] > t.shape[lay["dim"]]):
                raise LookupError(f"{tname}: trainer shape {list(t.shape)} does not hold rows "
                                  f"{piece[3]}..{piece[3] + piece[2]} of dim {lay['dim']}")
            out[i] = layout.trainer_view(t, lay, piece)
        return out

    def __exit__(self, *exc):
        return self.gathered.__exit__(*exc)


def trainer_digests(desc: dict, names: list, params: dict) -> list:
    """What :func:`fingerprint` must return for ``names`` on the worker ``desc`` describes,
    computed from the trainer's tensors (one digest per piece, per name)."""
    pieces, specs, owners = [], [], []
    for name in names:
        d = desc["params"][name]
        lay, dtype = d["layout"], _dtype(d["dtype"])
        shape = list(d["shape"]) or [1]
        for piece in lay["pieces"]:
            pshape = [1] if lay.get("scalar") else [piece[2] if k == lay["dim"] else s for k, s in enumerate(shape)]
            pieces.append((piece[0], lay, piece))
            specs.append((pshape, dtype))
        owners.append(len(lay["pieces"]))
    plan = digest.plan(specs)
    flat = plan.run(lambda idx: _Slices(params, pieces, idx))
    out, pos = [], 0
    for n in owners:
        out.append(flat[pos:pos + n])
        pos += n
    return out


def compare(results: list, descs: dict, names: list, params: dict) -> list:
    """Tensors (``"name (tp rank r)"``) whose digests differ from the trainer's, on every worker."""
    differ = []
    for r in results:
        rank = r["rank"]
        tag = f" (tp rank {rank})" if len(results) > 1 or rank else ""
        want = trainer_digests(descs[rank], names, params)
        got = r.get("digests") or []
        if len(got) != len(want):
            differ.extend(n + tag for n in names)
            continue
        differ.extend(n + tag for n, a, b in zip(names, got, want) if a != b)
    return differ
