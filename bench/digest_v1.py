"""Exact digests of many tensors where they live: a position-sensitive hash of their bit patterns.

One digest per *piece*: a tensor (any strides, any device) written in a floating ``dtype``
(the engine's: a trainer tensor in float32 is rounded exactly as the push's ``param.copy_``
rounds it). The definition is integer arithmetic without overflow, so every route below
gives the same numbers on every device, whatever order a kernel sums in:

- ``X``: the piece's elements in row-major order, written as ``dtype``, read as signed
  bytes (little endian) and zero-padded to whole rows of :data:`ROW` bytes (``R x ROW``).
- ``Y = X @ B``: ``B`` is a fixed ``ROW x COLS`` matrix of nonzero int8 (int32 result,
  ``|Y| <= ROW * 128 * 127 < 2**26``).
- digest ``[sum_r Y[r, c] * A[r, c] for c in range(COLS)]``: ``A`` fixed odd coefficients
  below 2**12 indexed by the row *within the piece* (int64, below 2**63 up to 2**25 rows).

Every changed byte changes all ``COLS`` sums (``B`` nonzero, ``A`` odd, one term), so one
changed element is always seen; a byte moved to another column meets another ``B`` row,
to another row another ``A`` row, so permutations show too (a plain sum misses them).

Cost: pieces are packed into buffers of up to :data:`BUDGET` bytes (one batched
``torch._foreach_copy_`` per buffer: the cast and the gather of strided slices in one
pass), one ``torch._int_mm`` per buffer, a few small kernels to fold the rows, and one
device-to-host copy of ``COLS`` int64 per piece per call. ``_int_mm`` (int8 tensor cores
on CUDA) is used where a self-check on the device shows it exact; otherwise float64
matmul (exact for these magnitudes), otherwise an elementwise route.
"""
from __future__ import annotations

import threading

ROW = 4096
"""Bytes per hash row (the inner dimension of the int8 matmul)."""
COLS = 8
"""Columns of ``B``: sums per digest."""
BUDGET = 1 << 27
"""Bytes of one packing buffer (128 MiB); a larger piece is hashed in leading-dimension chunks."""
MIN_ROWS = 32
"""Rows of a buffer are a multiple of this (CUDA ``_int_mm`` wants more than 16)."""
MASK32 = 0xFFFFFFFF

_lock = threading.Lock()
_consts: dict = {}   # device -> (B, A table)
_routes: dict = {}   # device type -> route name


def _mix(x):
    """A 32-bit integer hash of an int64 tensor of values in [0, 2**32): no step overflows int64."""
    x = (x ^ (x >> 16)) & MASK32
    x = (x * 0x45D9F3B) & MASK32
    x = (x ^ (x >> 16)) & MASK32
    x = (x * 0x45D9F3B) & MASK32
    return (x ^ (x >> 16)) & MASK32


def b_matrix():
    """``B``: ``ROW x COLS`` int8, every entry nonzero, in [-127, 127] (CPU)."""
    import torch

    h = _mix(torch.arange(ROW * COLS, dtype=torch.int64) + 0x5EED) % 254 - 127
    h = torch.where(h >= 0, h + 1, h)
    return h.to(torch.int8).reshape(ROW, COLS)


def a_table(rows: int):
    """``A`` for rows ``0..rows-1`` of a piece: odd int64 coefficients in [1, 4095] (CPU)."""
    import torch

    return (_mix(torch.arange(rows * COLS, dtype=torch.int64) + 0xA11CE) & 0x7FF).mul_(2).add_(1) \
        .reshape(rows, COLS)


def _device_consts(device, rows: int):
    key = str(device)
    with _lock:
        have = _consts.get(key)
        if have is None or have[1].shape[0] < rows:
            size = max(rows, 2 * have[1].shape[0] if have is not None else 1024)
            b = have[0] if have is not None else b_matrix().to(device)
            have = _consts[key] = (b, a_table(size).to(device))
        return have


# ---------------------------------------------------------------------------
# X @ B, exactly: three routes, the first one the device proves exact is used
# ---------------------------------------------------------------------------
def _exact(x, b):
    """Elementwise, in int32 (any device; slow)."""
    import torch

    out = torch.empty(x.shape[0], COLS, dtype=torch.int32, device=x.device)
    bi = b.to(torch.int32)
    for i in range(0, x.shape[0], 64):
        out[i:i + 64] = (x[i:i + 64].to(torch.int32).unsqueeze(-1) * bi).sum(1, dtype=torch.int32)
    return out


def _float64(x, b):
    """float64 matmul: every product and partial sum is an integer below 2**53, so exact."""
    import torch

    out = torch.empty(x.shape[0], COLS, dtype=torch.int32, device=x.device)
    bd = b.to(torch.float64)
    for i in range(0, x.shape[0], 4096):
        out[i:i + 4096] = (x[i:i + 4096].to(torch.float64) @ bd).to(torch.int32)
    return out


def _int_mm(x, b):
    import torch

    return torch._int_mm(x, b)


ROUTES = {"int_mm": _int_mm, "float64": _float64, "exact": _exact}


def route(device) -> str:
    """The route for ``device``'s type: the first of :data:`ROUTES` whose result on a probe
    (random bytes, all-extreme bytes) equals the CPU elementwise result."""
    import torch

    kind = torch.device(device).type
    with _lock:
        if kind in _routes:
            return _routes[kind]
    g = torch.Generator().manual_seed(7)
    probe = torch.cat([torch.randint(-128, 128, (MIN_ROWS, ROW), generator=g, dtype=torch.int8),
                       torch.full((MIN_ROWS, ROW), -128, dtype=torch.int8)])
    b = b_matrix()
    truth = _exact(probe, b)
    chosen = "exact"
    for name, fn in ROUTES.items():
        try:
            got = fn(probe.to(device), b.to(device)).cpu()
        except Exception:  # not supported on this device / build
            continue
        if torch.equal(got, truth):
            chosen = name
            break
    with _lock:
        _routes[kind] = chosen
    return chosen


# ---------------------------------------------------------------------------
# packing many pieces into few buffers
# ---------------------------------------------------------------------------
def _nbytes(shape, dtype) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * dtype.itemsize


def _rows(nbytes: int) -> int:
    return max(1, -(-nbytes // ROW))


class Plan:
    """Where each piece of a list of ``(shape, dtype)`` goes: segments packed into buffers.

    A segment is a whole piece, or (a piece over :data:`BUDGET`) a run of its leading rows
    that starts on a hash-row boundary, so chunking never changes the digest."""

    def __init__(self, specs):
        import math

        self.specs = [(tuple(int(s) for s in shape), dtype) for shape, dtype in specs]
        segments = []  # (piece, lead_start, lead_len or None, row0, nbytes)
        for i, (shape, dtype) in enumerate(self.specs):
            nbytes = _nbytes(shape, dtype)
            if nbytes <= BUDGET or len(shape) < 1 or shape[0] < 2:
                segments.append((i, 0, None, 0, nbytes))
                continue
            row_bytes = nbytes // shape[0]
            step = math.lcm(row_bytes, ROW) // row_bytes  # leading rows per whole hash rows
            per = max(step, (BUDGET // (step * row_bytes)) * step)
            if step >= shape[0]:
                segments.append((i, 0, None, 0, nbytes))
                continue
            for start in range(0, shape[0], per):
                n = min(per, shape[0] - start)
                segments.append((i, start, n, start * row_bytes // ROW, n * row_bytes))
        self.groups = []  # [(segments, row offsets, rows)]
        current, offsets, rows = [], [], 0
        for seg in segments:
            need = _rows(seg[4])
            if current and (rows + need) * ROW > BUDGET:
                self.groups.append(self._close(current, offsets, rows))
                current, offsets, rows = [], [], 0
            current.append(seg)
            offsets.append(rows)
            rows += need
        if current:
            self.groups.append(self._close(current, offsets, rows))
        self._dev: dict = {}

    @staticmethod
    def _close(segs, offsets, rows):
        return segs, offsets, -(-rows // MIN_ROWS) * MIN_ROWS

    def _indices(self, device, k: int):
        """Per buffer ``k``: the piece row of every buffer row (A's index) and segment row spans."""
        import torch

        key = (str(device), k)
        if key not in self._dev:
            segs, offsets, rows = self.groups[k]
            local = torch.zeros(rows, dtype=torch.int64)
            starts, ends = [], []
            for seg, off in zip(segs, offsets):
                n = _rows(seg[4])
                local[off:off + n] = torch.arange(seg[3], seg[3] + n)
                starts.append(off)
                ends.append(off + n)
            self._dev[key] = (local.to(device), torch.tensor(starts, device=device),
                              torch.tensor(ends, device=device), int(local.max()) + 1)
        return self._dev[key]

    def run(self, fetch) -> list:
        """Digests (lists of :data:`COLS` ints) of every piece. ``fetch(pieces)`` is a context
        manager yielding ``{piece: tensor}`` for one buffer's pieces (ZeRO-3 gathers there)."""
        import torch

        out = []   # device tensors [segments, COLS]
        owners = []
        with torch.no_grad():
            for k, (segs, offsets, rows) in enumerate(self.groups):
                with fetch(sorted({s[0] for s in segs})) as tensors:
                    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")
                    buf = torch.zeros(rows * ROW, dtype=torch.int8, device=device)
                    dsts, srcs = [], []
                    for (piece, lead, n, _, nbytes), off in zip(segs, offsets):
                        shape, dtype = self.specs[piece]
                        src = tensors[piece]
                        if tuple(src.shape) != shape and not (shape == () and src.numel() == 1):
                            raise LookupError(f"piece {piece}: shape {tuple(src.shape)} is not {shape}")
                        src = src.reshape(1) if src.dim() == 0 else src
                        if n is not None:
                            src = src.narrow(0, lead, n)
                        if src.device != device:
                            src = src.to(device)
                        dsts.append(buf[off * ROW:off * ROW + nbytes].view(dtype).view(src.shape))
                        srcs.append(src)
                    _copy(dsts, srcs)
                out.append(self._fold(buf.view(rows, ROW), device, k))
                owners.extend(s[0] for s in segs)
            host = torch.cat([o.cpu() for o in out]).tolist() if out else []
        digests = [[0] * COLS for _ in self.specs]
        for piece, sums in zip(owners, host):
            d = digests[piece]
            for c in range(COLS):
                d[c] += sums[c]
        return digests

    def _fold(self, x, device, k: int):
        import torch

        local, starts, ends, need = self._indices(device, k)
        b, a = _device_consts(device, need)
        y = ROUTES[route(device)](x, b)
        prod = torch.cumsum(y.to(torch.int64) * a[local], 0)
        prod = torch.nn.functional.pad(prod, (0, 0, 1, 0))
        return prod[ends] - prod[starts]


def _copy(dsts, srcs) -> None:
    import torch

    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        try:
            foreach(dsts, srcs)
            return
        except (RuntimeError, TypeError, NotImplementedError):
            pass  # this build / device: one copy per piece
    for d, s in zip(dsts, srcs):
        d.copy_(s)


_plans: dict = {}
PLANS = 256
"""Plans kept (one per distinct list of piece shapes: exact mode has one, sample mode one per slice)."""


def plan(specs) -> Plan:
    key = tuple((tuple(int(s) for s in shape), str(dtype)) for shape, dtype in specs)
    with _lock:
        p = _plans.get(key)
    if p is None:
        p = Plan(specs)
        with _lock:
            if len(_plans) >= PLANS:
                _plans.pop(next(iter(_plans)))
            _plans[key] = p
    return p


class _Given:
    def __init__(self, tensors):
        self.tensors = tensors

    def __enter__(self):
        return self.tensors

    def __exit__(self, *exc):
        return False


def digests(pieces, dtypes=None) -> list:
    """Digests of ``pieces`` (tensors), each written as its entry of ``dtypes`` (default: its own)."""
    dtypes = dtypes or [p.dtype for p in pieces]
    p = plan([(tuple(t.shape), d) for t, d in zip(pieces, dtypes)])
    return p.run(lambda idx: _Given({i: pieces[i] for i in idx}))


def reference(t, dtype=None) -> list:
    """The definition written out for one tensor, on the CPU, with Python integers (tests)."""
    import torch

    dtype = dtype or t.dtype
    raw = t.detach().to("cpu", dtype).contiguous().reshape(-1).view(torch.int8)
    rows = _rows(raw.numel())
    x = torch.zeros(rows * ROW, dtype=torch.int8)
    x[:raw.numel()] = raw
    y = _exact(x.view(rows, ROW), b_matrix()).tolist()
    a = a_table(rows).tolist()
    return [sum(y[r][c] * a[r][c] for r in range(rows)) for c in range(COLS)]
