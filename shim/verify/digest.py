"""Exact digests of many tensors where they live: a position-sensitive hash of their bit patterns.

One digest per *piece*: a tensor (any strides, any device) written in a floating ``dtype``
(the engine's: a trainer tensor in float32 is rounded exactly as the push's ``param.copy_``
rounds it). The definition is integer arithmetic without overflow, so every route below
gives the same numbers on every device, whatever order a kernel sums in:

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

Cost: each piece is read once where it lives. Routes (:data:`ROUTE`): ``triton`` (CUDA: one
kernel launch per kind of source over every piece of a :func:`partials_many` call,
:mod:`shim.verify.digest_triton`), ``torch`` (any device: chunks of :data:`CHUNK_ROWS` rows, an int32
product and int64 sums), chosen per device by a self-check against the CPU; the partial sums
of all pieces of one call cross to the host in one copy.
"""
from __future__ import annotations

import threading

K = 1024
"""16-bit words per hash row."""
COLS = 4
"""Sums per digest."""
CHUNK_ROWS = 1 << 15
"""Rows the ``torch`` route handles per step (bounds its int32 temporary: 128 MiB)."""
ROUTE = "auto"
"""``auto`` (``triton`` where its self-check on the device passes, else ``torch``), ``triton``, ``torch``."""
MASK32 = 0xFFFFFFFF

_lock = threading.Lock()
_tables: dict = {}   # device -> (P int32 [K, COLS], Q int32 [rows, COLS])
_routes: dict = {}   # device type -> route name


def _mix(x):
    """A 32-bit integer hash of an int64 tensor of values in [0, 2**32): no step overflows int64."""
    x = (x ^ (x >> 16)) & MASK32
    x = (x * 0x45D9F3B) & MASK32
    x = (x ^ (x >> 16)) & MASK32
    x = (x * 0x45D9F3B) & MASK32
    return (x ^ (x >> 16)) & MASK32


def p_table():
    """``P``: ``K x COLS`` odd int32 weights in [1, 63] (CPU)."""
    import torch

    return (_mix(torch.arange(K * COLS, dtype=torch.int64) + 0x5EED) & 0x3F).bitwise_or_(1) \
        .to(torch.int32).reshape(K, COLS)


def q_table(rows: int):
    """``Q`` for rows ``0..rows-1`` of a piece: odd int32 weights in [1, 4095] (CPU)."""
    import torch

    return (_mix(torch.arange(rows * COLS, dtype=torch.int64) + 0xA11CE) & 0x7FF).mul_(2).add_(1) \
        .to(torch.int32).reshape(rows, COLS)


def tables(device, rows: int):
    """``(P, Q)`` on ``device``, ``Q`` for at least ``rows`` rows (cached, grown by doubling)."""
    key = str(device)
    with _lock:
        have = _tables.get(key)
        if have is None or have[1].shape[0] < rows:
            size = max(rows, 2 * have[1].shape[0] if have is not None else 1 << 12)
            p = have[0] if have is not None else p_table().to(device)
            have = _tables[key] = (p, q_table(size).to(device))
        return have


# ---------------------------------------------------------------------------
# the words of a piece
# ---------------------------------------------------------------------------
def _elements_per_row(dtype) -> int:
    return 2 * K // dtype.itemsize


def _rows_of(numel: int, dtype) -> int:
    return max(1, -(-(numel * dtype.itemsize) // (2 * K)))


def _words(flat, dtype):
    """``flat`` (1-D) written as ``dtype``, as an ``[rows, K]`` int16 tensor (zero-padded)."""
    import torch

    raw = flat.to(dtype).contiguous().view(torch.int8)
    pad = -raw.numel() % (2 * K)
    if pad or raw.numel() == 0:
        raw = torch.cat([raw, raw.new_zeros(pad or 2 * K)])
    return raw.view(torch.int16).view(-1, K)


class Rows:
    """One piece's partial sums: rows ``start:stop`` of a device int64 ``[n, COLS]`` tensor (the
    pieces of one launch share one tensor; :func:`collect` copies each tensor to the host once)."""

    __slots__ = ("table", "start", "stop")

    def __init__(self, table, start: int = 0, stop: "int | None" = None):
        self.table, self.start, self.stop = table, start, table.shape[0] if stop is None else stop

    def tensor(self):
        return self.table[self.start:self.stop]


# ---------------------------------------------------------------------------
# routes: partial sums [n, COLS] int64 whose column sums are the digest
# ---------------------------------------------------------------------------
def _torch_partials(t, dtype):
    import torch

    flat = t.reshape(-1)
    rows = _rows_of(flat.numel(), dtype)
    p, q = tables(flat.device, rows)
    per = CHUNK_ROWS * _elements_per_row(dtype)
    out = []
    for start in range(0, max(1, flat.numel()), per):
        x = _words(flat[start:start + per], dtype)
        r0 = start // _elements_per_row(dtype)
        qs = q[r0:r0 + x.shape[0]].to(torch.int64)
        out.append(torch.stack([((x * p[:, c]).sum(1, dtype=torch.int64) * qs[:, c]).sum()
                                for c in range(COLS)]))
    return torch.stack(out)


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


def _prepared(t):
    t = t.detach()
    return t.reshape(1) if t.dim() == 0 else t


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
    """The definition written out for one tensor, on the CPU, with Python integers (tests)."""

    dtype = dtype or t.dtype
    x = _words(t.detach().to("cpu").reshape(-1), dtype).tolist()
    p = p_table().tolist()
    q = q_table(len(x)).tolist()
    return [wrap(sum(q[r][c] * sum(x[r][k] * p[k][c] for k in range(K)) for r in range(len(x))))
            for c in range(COLS)]
