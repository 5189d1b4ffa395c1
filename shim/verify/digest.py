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
- digest ``[sum_r Q[r, c] * sum_k x[r, k] * P[k, c] for c in range(COLS)]`` (a row's inner
  sum is below ``K * 2**15 * 63 < 2**31``; Python integers add the partial sums, so a piece
  of any size is exact).

Every changed word changes all ``COLS`` sums (``P`` and ``Q`` odd, one term), so one changed
element is always seen; a word moved to another position meets other weights in ``P`` or
``Q`` (independent per column), so permutations show too (a plain sum misses them).

Cost: each piece is read once where it lives. Routes (:data:`ROUTE`): ``triton`` (CUDA: one
fused kernel per piece reads the source -- float32 trainer tensors rounded to the engine's
dtype in registers, no cast buffer -- and writes one int64 partial per :data:`BLOCK_ROWS`
rows), ``torch`` (any device: chunks of :data:`CHUNK_ROWS` rows, an int32 product and
int64 sums), chosen per device by a self-check against the CPU; the partial sums of all
pieces of one call cross to the host in one copy.
"""
from __future__ import annotations

import threading

K = 1024
"""16-bit words per hash row."""
COLS = 4
"""Sums per digest."""
CHUNK_ROWS = 1 << 15
"""Rows the ``torch`` route handles per step (bounds its int32 temporary: 128 MiB)."""
BLOCK_ROWS = 16
"""Rows one ``triton`` program reduces."""
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


_kernel = None


def _triton_kernel():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def fold(src, n, P, Q, out, KW: tl.constexpr, BR: tl.constexpr, NC: tl.constexpr, CAST: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid.to(tl.int64) * (BR * KW) + tl.arange(0, BR * KW)
            v = tl.load(src + offs, mask=offs < n, other=0)
            if CAST == 1:
                v = v.to(tl.bfloat16).to(tl.int16, bitcast=True)
            elif CAST == 2:
                v = v.to(tl.float16).to(tl.int16, bitcast=True)
            w = tl.reshape(v.to(tl.int32), (BR, KW))
            k = tl.arange(0, KW)
            r = pid.to(tl.int64) * BR + tl.arange(0, BR)
            for c in tl.static_range(NC):
                pc = tl.load(P + k * NC + c)
                s = tl.sum(w * pc[None, :], axis=1).to(tl.int64)
                qc = tl.load(Q + r * NC + c).to(tl.int64)
                tl.store(out + pid * NC + c, tl.sum(s * qc, axis=0))

        _kernel = fold
    return _kernel


def _triton_partials(t, dtype):
    import torch

    if dtype.itemsize != 2 or t.dtype.itemsize not in (2, 4) or not t.is_floating_point():
        return _torch_partials(t, dtype)
    src = t.contiguous().reshape(-1)
    if src.dtype.itemsize == 2:
        src, cast = src.to(dtype).view(torch.int16), 0
    else:
        cast = 1 if dtype == torch.bfloat16 else 2
    n = src.numel()
    rows = _rows_of(n, dtype)
    progs = -(-rows // BLOCK_ROWS)
    p, q = tables(src.device, progs * BLOCK_ROWS)
    out = torch.empty(progs, COLS, dtype=torch.int64, device=src.device)
    if n:
        _triton_kernel()[(progs,)](src, n, p, q, out, KW=K, BR=BLOCK_ROWS, NC=COLS, CAST=cast)
    else:
        out.zero_()
    return out


ROUTES = {"triton": _triton_partials, "torch": _torch_partials}


def route(device) -> str:
    """The route for ``device``'s type: :data:`ROUTE`, or under ``auto`` the first of
    :data:`ROUTES` whose digests of a probe (random and extreme values, float32 rounded and
    not, a ragged tail) equal the CPU ``torch`` route's."""
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
                 torch.randn(BLOCK_ROWS * K * 3 + 1, generator=g).to(torch.bfloat16)]
        for name, fn in ROUTES.items():
            if name == "torch":
                break
            try:
                ok = all(torch.equal(fn(t.to(device), d).sum(0).cpu(), _torch_partials(t, d).sum(0))
                         for t in probe for d in (torch.bfloat16, torch.float16))
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
    import torch

    with torch.no_grad():
        t = t.detach()
        return ROUTES[route(t.device)](t.reshape(1) if t.dim() == 0 else t, dtype or t.dtype)


def digests(pieces, dtypes=None) -> list:
    """Digests (lists of :data:`COLS` ints) of ``pieces`` (tensors), each written as its entry
    of ``dtypes`` (default: its own). One device-to-host copy per device."""
    return collect([partials(t, d) for t, d in zip(pieces, dtypes or [p.dtype for p in pieces])])


def collect(parts: list) -> list:
    """Digests from :func:`partials` results: one host copy per device, sums in Python integers."""
    import torch

    by_device: dict = {}
    for i, p in enumerate(parts):
        by_device.setdefault(str(p.device), []).append(i)
    out = [None] * len(parts)
    for idx in by_device.values():
        host = torch.cat([parts[i] for i in idx]).cpu().tolist()
        pos = 0
        for i in idx:
            rows = host[pos:pos + parts[i].shape[0]]
            pos += parts[i].shape[0]
            out[i] = [sum(r[c] for r in rows) for c in range(COLS)]
    return out


def reference(t, dtype=None) -> list:
    """The definition written out for one tensor, on the CPU, with Python integers (tests)."""

    dtype = dtype or t.dtype
    x = _words(t.detach().to("cpu").reshape(-1), dtype).tolist()
    p = p_table().tolist()
    q = q_table(len(x)).tolist()
    return [sum(q[r][c] * sum(x[r][k] * p[k][c] for k in range(K)) for r in range(len(x)))
            for c in range(COLS)]
