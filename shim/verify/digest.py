"""Exact digests of many tensors where they live: a position-sensitive hash of their bit patterns.

Weight verification compares the engine's weights with the trainer's without moving them: one digest per
*piece* (a tensor, any strides, any device, written in a floating ``dtype``: the engine's, so a trainer tensor
in float32 is rounded exactly as the push's ``param.copy_`` rounds it). The definition (:func:`reference`) is
integer arithmetic without overflow, so every route gives the same numbers on every device, whatever order a
kernel sums in; one changed element is always seen, and so are permutations (a plain sum misses them).

Cost: each piece is read once where it lives. Routes (:data:`ROUTE`): ``triton`` (CUDA: one kernel launch per
kind of source over every piece of a :func:`partials_many` call, :mod:`shim.verify.digest_triton`), ``torch``
(any device: chunks of :data:`CHUNK_ROWS` rows, an int32 product and int64 sums), chosen per device by a
self-check against the CPU; the partial sums of all pieces of one call cross to the host in one copy.
"""
from __future__ import annotations

from shim.verify.digest_rows import CHUNK_ROWS, COLS, K, Rows, p_table, q_table, words  # noqa: F401
from shim.verify.digest_rows import lock as _lock
from shim.verify.digest_rows import prepared as _prepared
from shim.verify.digest_rows import torch_partials as _torch_partials

ROUTE = "auto"
"""``auto`` (``triton`` where its self-check on the device passes, else ``torch``), ``triton``, ``torch``."""
_routes: dict = {}   # device type -> route name


# ---------------------------------------------------------------------------
# routes: partial sums [n, COLS] int64 whose column sums are the digest
# ---------------------------------------------------------------------------
def _triton_many(pieces, dtypes) -> list:
    """The ``triton`` route (:mod:`shim.verify.digest_triton`, imported when first used)."""
    from shim.verify import digest_triton

    return digest_triton.many(pieces, dtypes)


def _torch_many(pieces, dtypes) -> list:
    return [Rows(_torch_partials(_prepared(t), d)) for t, d in zip(pieces, dtypes)]


ROUTES = {"triton": _triton_many, "torch": _torch_many}


def route(device) -> str:
    """The route for ``device``'s type: :data:`ROUTE`, or under ``auto`` the first of
    :data:`ROUTES` whose digests of a probe (random and extreme values, float32 rounded and
    not, a ragged tail, several pieces in one call) equal the CPU ``torch`` route's."""
    import torch

    kind = torch.device(device).type
    if ROUTE != "auto":
        return ROUTE
    with _lock:
        if kind in _routes:
            return _routes[kind]
    chosen = "torch"
    if kind != "cpu":
        g = torch.Generator().manual_seed(7)
        probe = [torch.randn(3 * K + 5, generator=g) * 1e3, torch.full((2 * K,), -3.0e38),
                 torch.randn(24 * K + 1, generator=g).to(torch.bfloat16)]
        for name, fn in ROUTES.items():
            if name == "torch":
                break
            try:
                ok = all(collect(fn([t.to(device) for t in probe], [d] * len(probe)))
                         == collect([Rows(_torch_partials(t, d)) for t in probe])
                         for d in (torch.bfloat16, torch.float16))
            except Exception:  # not available on this device / build
                ok = False
            if ok:
                chosen = name
                break
    with _lock:
        _routes[kind] = chosen
    return chosen


def partials(t, dtype=None):
    """Device int64 ``[n, COLS]`` whose column sums are ``t``'s digest as ``dtype``."""
    return partials_many([t], [dtype])[0].tensor()


def partials_many(pieces, dtypes=None) -> list:
    """:class:`Rows` of each piece (``dtypes``: each one's, None = its own), computed together:
    the ``triton`` route launches once per kind of source, not once per piece."""
    import torch

    dtypes = [d or t.dtype for t, d in zip(pieces, dtypes or [None] * len(pieces))]
    if not pieces:
        return []
    if all(t.is_cuda for t in pieces):  # the usual call: one route lookup, no device object per piece
        names = {route("cuda")}
    else:
        names = {route(device) for device in {t.device for t in pieces}}
    with torch.no_grad():
        if names == {"torch"}:
            return _torch_many(pieces, dtypes)
        return ROUTES[next(iter(names - {"torch"}))](pieces, dtypes)


def digests(pieces, dtypes=None) -> list:
    """Digests (lists of :data:`COLS` ints) of ``pieces`` (tensors), each written as its entry
    of ``dtypes`` (default: its own). One device-to-host copy per device."""
    return collect(partials_many(pieces, dtypes))


def wrap(v: int) -> int:
    """``v`` as a signed 64-bit integer (the digest's sums are taken modulo ``2**64``)."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def collect(parts: list) -> list:
    """Digests from :func:`partials_many` results (:class:`Rows`): one host copy per device, sums
    modulo ``2**64``."""
    import torch

    tables: dict = {}  # id(table) -> table, in first-seen order
    last = None
    for p in parts:
        if p.table is not last:  # the pieces of one launch share one table: look it up once per run
            last = p.table
            tables.setdefault(id(last), last)
    by_device: dict = {}
    for key, table in tables.items():
        by_device.setdefault(str(table.device), []).append(key)
    at: dict = {}  # id(table) -> (host rows, offset)
    for keys in by_device.values():
        host = torch.cat([tables[k] for k in keys]).cpu().tolist()
        pos = 0
        for k in keys:
            at[k] = (host, pos)
            pos += tables[k].shape[0]
    out = []
    last = None
    for p in parts:
        if p.table is not last:
            last = p.table
            host, base = at[id(last)]
        if p.stop - p.start == 1:  # one row (a triton launch's per-piece sums): int64 already, wrapped
            out.append(host[base + p.start])
            continue
        rows = host[base + p.start:base + p.stop]
        out.append([wrap(sum(r[c] for r in rows)) for c in range(COLS)])
    return out


def reference(t, dtype=None) -> list:
    """The definition written out for one tensor, on the CPU, with Python integers (tests).

    - ``x``: the piece's elements in row-major order, written as ``dtype``, their bytes read as
      little-endian signed 16-bit words, zero-padded to whole rows of :data:`K` words
      (``x[r, k]``, ``|x| <= 2**15``).
    - ``P[k, c]``: fixed odd weights in [1, 63] per position in a row; ``Q[r, c]``: fixed odd
      weights in [1, 4095] per row *within the piece* (:func:`p_table`, :func:`q_table`).
    - digest ``[sum_r Q[r, c] * sum_k x[r, k] * P[k, c] for c in range(COLS)]`` modulo ``2**64``
      (as signed 64-bit integers: a row's inner sum is below ``K * 2**15 * 63 < 2**31``, the device
      adds the rows in int64 and wraps; the host sums partials in Python integers and wraps the same
      way, so every route gives the same digest for a piece of any size).

    Every changed word changes all ``COLS`` sums (``P`` and ``Q`` odd, one term: an odd multiple of a
    change below ``2**16`` is never 0 modulo ``2**64``), so one changed
    element is always seen; a word moved to another position meets other weights in ``P`` or
    ``Q`` (independent per column), so permutations show too (a plain sum misses them).
    """

    dtype = dtype or t.dtype
    x = words(t.detach().to("cpu").reshape(-1), dtype).tolist()
    p = p_table().tolist()
    q = q_table(len(x)).tolist()
    return [wrap(sum(q[r][c] * sum(x[r][k] * p[k][c] for k in range(K)) for r in range(len(x))))
            for c in range(COLS)]
