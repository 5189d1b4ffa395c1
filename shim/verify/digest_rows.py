"""The digest's definition (:mod:`shim.verify.digest`): its tables, the words of a piece, the rows of
partial sums, and the ``torch`` route's partials, which every other route must equal bit for bit. Kept
apart so the routes (``shim.verify.digest_triton``) and the digest read one definition without
importing each other."""
from __future__ import annotations

import threading

K = 1024
"""16-bit words per hash row."""
COLS = 4
"""Sums per digest."""
CHUNK_ROWS = 1 << 15
"""Rows the ``torch`` route handles per step (bounds its int32 temporary: 128 MiB)."""
MASK32 = 0xFFFFFFFF

lock = threading.Lock()
_tables: dict = {}   # device -> (P int32 [K, COLS], Q int32 [rows, COLS])


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
    with lock:
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


def words(flat, dtype):
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


def torch_partials(t, dtype):
    """The ``torch`` route's partial sums of one piece (any device: :data:`CHUNK_ROWS` rows a step)."""
    import torch

    flat = t.reshape(-1)
    rows = _rows_of(flat.numel(), dtype)
    p, q = tables(flat.device, rows)
    per = CHUNK_ROWS * _elements_per_row(dtype)
    out = []
    for start in range(0, max(1, flat.numel()), per):
        x = words(flat[start:start + per], dtype)
        r0 = start // _elements_per_row(dtype)
        qs = q[r0:r0 + x.shape[0]].to(torch.int64)
        out.append(torch.stack([((x * p[:, c]).sum(1, dtype=torch.int64) * qs[:, c]).sum()
                                for c in range(COLS)]))
    return torch.stack(out)


def prepared(t):
    """``t`` detached, a 0-d tensor as one element."""
    t = t.detach()
    return t.reshape(1) if t.dim() == 0 else t
