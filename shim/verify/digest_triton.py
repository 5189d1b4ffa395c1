"""The ``triton`` route of :mod:`shim.verify.digest` (CUDA): one kernel launch per kind of source over every piece
of a :func:`shim.verify.digest.partials_many` call.

A table maps each program to its piece and first row; float32 trainer tensors are rounded to the engine's dtype in
registers (no cast buffer); one int64 partial per :data:`BLOCK_ROWS` rows, added per piece on the device. Same
definition as the ``torch`` route, bit for bit (``digest.route`` checks it on each device type before using it).
"""
from __future__ import annotations

from shim.verify.digest_rows import COLS, K, Rows, lock, prepared, tables, torch_partials

BLOCK_ROWS = 8
"""Rows one ``triton`` program reduces."""
TRITON_DEVICES = ("cuda",)
"""Device types the ``triton`` route takes (tests add ``cpu`` under ``TRITON_INTERPRET=1``)."""

_kernel = None


def _triton_kernel():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def fold(ptrs, nel, bpiece, brow, P, Q, out, KW: tl.constexpr, BR: tl.constexpr, NC: tl.constexpr,
                 CAST: tl.constexpr):
            # one program: BR rows of one piece (a table maps the program to its piece and first row)
            pid = tl.program_id(0)
            piece = tl.load(bpiece + pid)
            r0 = tl.load(brow + pid)
            n = tl.load(nel + piece)
            if CAST == 0:
                base = tl.load(ptrs + piece).to(tl.pointer_type(tl.int16))
            else:
                base = tl.load(ptrs + piece).to(tl.pointer_type(tl.float32))
            offs = r0 * KW + tl.arange(0, BR * KW).to(tl.int64)
            v = tl.load(base + offs, mask=offs < n, other=0)
            if CAST == 1:  # float32 -> bfloat16 bits, rounded to nearest even as torch's cast (NaN -> 0x7FC0)
                b = v.to(tl.uint32, bitcast=True)
                b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
                b = tl.where(v != v, 0x7FC0, b).to(tl.int32)
                v = tl.where(b >= 0x8000, b - 0x10000, b)
            elif CAST == 2:
                v = v.to(tl.float16).to(tl.int16, bitcast=True)
            w = tl.reshape(v.to(tl.int32), (BR, KW))
            k = tl.arange(0, KW)
            r = r0 + tl.arange(0, BR)
            for c in tl.static_range(NC):
                pc = tl.load(P + k * NC + c)
                s = tl.sum(w * pc[None, :], axis=1).to(tl.int64)
                qc = tl.load(Q + r * NC + c).to(tl.int64)
                tl.store(out + pid * NC + c, tl.sum(s * qc, axis=0))

        _kernel = fold
    return _kernel


def _triton_source(t, dtype, devices: tuple, bf16):
    """``(flat source, CAST)`` for the kernel, or None where the ``torch`` route must do it (not a
    tensor of ``devices`` (CUDA), not a 2-byte target, not a 2- or 4-byte float source). A contiguous
    source that is float32 or already ``dtype`` is the tensor itself (the kernel reads its words).
    ``bf16``: ``torch.bfloat16`` (passed in: no import per piece)."""
    cuda, cpu = devices
    source = t.dtype
    size = source.itemsize
    if not ((cuda and t.is_cuda) or (cpu and t.is_cpu)) or dtype.itemsize != 2 or size not in (2, 4) \
            or not source.is_floating_point:
        return None
    if size == 2 and source != dtype:
        return t.to(dtype), 0
    if not t.is_contiguous():
        t = t.contiguous()
    return t, 0 if size == 2 else 1 if dtype == bf16 else 2


_plans: dict = {}   # (device, CAST, BLOCK_ROWS, (data_ptr, numel) of each member) -> launch tables (last few calls)
PLANS = 8
"""Launch tables kept (a check's pieces sit at the same addresses from one check to the next)."""


def _plan(device, cast: int, members: list):
    """``(table [3, n], program -> piece, program -> first row, programs, rows)`` for one launch of
    ``members`` (``(data_ptr, numel)`` of each source), cached."""
    import torch

    key = (str(device), cast, BLOCK_ROWS, tuple(members))
    with lock:
        got = _plans.get(key)
        if got is not None:
            _plans[key] = _plans.pop(key)  # most recently used last
            return got
    nels = [n for _, n in members]
    blocks = [-(-max(1, n) // (BLOCK_ROWS * K)) for n in nels]
    total = sum(blocks)
    host = torch.tensor([[p for p, _ in members], nels, blocks], dtype=torch.int64)
    table = host.to(device)
    bpiece = torch.repeat_interleave(torch.arange(len(members), device=device), table[2], output_size=total)
    starts = torch.cumsum(table[2], 0) - table[2]
    brow = (torch.arange(total, device=device) - starts[bpiece]) * BLOCK_ROWS
    got = (table, bpiece, brow, total, max(blocks) * BLOCK_ROWS)
    with lock:
        _plans[key] = got
        while len(_plans) > PLANS:
            _plans.pop(next(iter(_plans)))
    return got


def many(pieces, dtypes) -> list:
    """The ``triton`` route over many pieces: one kernel launch per kind of source (2-byte words,
    float32 to bfloat16, float32 to float16) over every block of every piece of that kind, the
    blocks' partials added per piece on the device (``index_add_``). Pieces it cannot take go
    through the ``torch`` route. Host work per piece is a few attribute reads (a check has
    hundreds of pieces: a torch op per piece would cost more than the kernel)."""
    import torch

    devices = ("cuda" in TRITON_DEVICES, "cpu" in TRITON_DEVICES)
    out = [None] * len(pieces)
    groups: dict = {}  # (device index, CAST) -> (first source, [piece index], [(data_ptr, numel)])
    keep = []  # the sources (copies where a piece was not contiguous) until the launches are queued
    for i, (t, d) in enumerate(zip(pieces, dtypes)):
        got = _triton_source(t, d, devices, torch.bfloat16)
        if got is None:
            out[i] = Rows(torch_partials(prepared(t), d))
            continue
        src, cast = got
        keep.append(src)
        key = (src.get_device(), cast)
        group = groups.get(key)
        if group is None:
            group = groups[key] = (src, [], [])
        group[1].append(i)
        group[2].append((src.data_ptr(), src.numel()))
    for (_, cast), (first, index, members) in groups.items():
        device = first.device
        table, bpiece, brow, total, rows = _plan(device, cast, members)
        p, q = tables(device, rows)
        partial = torch.empty(total, COLS, dtype=torch.int64, device=device)
        _triton_kernel()[(total,)](table[0], table[1], bpiece, brow, p, q, partial, KW=K, BR=BLOCK_ROWS, NC=COLS,
                                   CAST=cast)
        sums = torch.zeros(len(members), COLS, dtype=torch.int64, device=device).index_add_(0, bpiece, partial)
        for row, i in enumerate(index):
            out[i] = Rows(sums, row, row + 1)
    del keep
    return out


