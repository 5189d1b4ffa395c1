"""Where the exact digest's time goes, and kernel variants that might remove it (H200 profiling bench).

Same synthetic pieces as ``bench/gpu_digest_micro.py`` (the 1.06 B Qwen2 shapes: engine bf16 views,
trainer float32). Every variant computes the digest of ``shim.verify.digest`` (the same per-piece
partial sums: checked against the module's own route before it is timed), so any of them can replace
the kernel. Printed per variant and source kind (``words``: the engine's bf16, ``f32``: the trainer's
float32 rounded to bf16): kernel-only ms (``triton.testing.do_bench``) and, for the whole check
(both sides, tables included, the host copy of the sums), ms, GB/s and x the read floor.

- ``v0``: ``shim.verify.digest.partials_many`` as it is (1-D offsets in int64, one mask over every
  element, ``tl.reshape`` to rows, ``P`` read with a stride).
- ``v1``: 2-D offsets in int32 from a per-program base pointer (the pointer hinted 16-byte aligned
  where it is), full blocks launched without a mask and the tails in a second, masked launch, ``P``
  stored column by column (contiguous loads).
- ``read``: ``v1``'s loads and a plain sum (no hash): the floor of this kernel's structure.
- ``mma``: ``v1``'s loads, each 16-bit word split into two int8 halves and the ``x @ P`` products
  taken on the tensor cores (``tl.dot`` int8 -> int32, ``BK`` columns at a time).

  python3 bench/gpu_digest_kernels.py                 # H200: $OUT/gpu_digest_kernels.json
  TRITON_INTERPRET=1 python3 bench/gpu_digest_kernels.py --small --device cpu   # CPU check of the variants
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_digest_micro as micro  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from shim.verify import digest  # noqa: E402

K, NC = digest.K, digest.COLS


@triton.jit
def fold_v1(ptrs, nel, bpiece, brow, PT, Q, out, KW: tl.constexpr, BR: tl.constexpr, NC: tl.constexpr,
            CAST: tl.constexpr, MASKED: tl.constexpr, ALIGN: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    piece = tl.load(bpiece + pid)
    r0 = tl.load(brow + pid)
    if CAST == 0:
        base = tl.load(ptrs + piece).to(tl.pointer_type(tl.int16))
    else:
        base = tl.load(ptrs + piece).to(tl.pointer_type(tl.float32))
    if ALIGN:
        base = tl.multiple_of(base, 16)
    base = base + r0 * KW
    rows = tl.arange(0, BR)
    k = tl.arange(0, KW)
    offs = rows[:, None] * KW + k[None, :]
    if MASKED:
        left = tl.load(nel + piece) - r0 * KW
        v = tl.load(base + offs, mask=offs < left, other=0)
    else:
        v = tl.load(base + offs)
    if CAST == 1:
        b = v.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        b = tl.where(v != v, 0x7FC0, b).to(tl.int32)
        w = tl.where(b >= 0x8000, b - 0x10000, b)
    else:
        w = v.to(tl.int32)
    if MODE == 1:  # read only
        tl.store(out + pid * NC, tl.sum(tl.sum(w, axis=1).to(tl.int64), axis=0))
    else:
        for c in tl.static_range(NC):
            pc = tl.load(PT + c * KW + k)
            s = tl.sum(w * pc[None, :], axis=1).to(tl.int64)
            qc = tl.load(Q + (r0 + rows) * NC + c).to(tl.int64)
            tl.store(out + pid * NC + c, tl.sum(s * qc, axis=0))


@triton.jit
def fold_mma(ptrs, nel, bpiece, brow, P8, PSUM, Q, out, KW: tl.constexpr, BR: tl.constexpr, NC: tl.constexpr,
             CAST: tl.constexpr, MASKED: tl.constexpr, ALIGN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    piece = tl.load(bpiece + pid)
    r0 = tl.load(brow + pid)
    if CAST == 0:
        base = tl.load(ptrs + piece).to(tl.pointer_type(tl.int16))
    else:
        base = tl.load(ptrs + piece).to(tl.pointer_type(tl.float32))
    if ALIGN:
        base = tl.multiple_of(base, 16)
    base = base + r0 * KW
    rows = tl.arange(0, BR)
    cols = tl.arange(0, 16)
    left = tl.load(nel + piece) - r0 * KW
    acc_hi = tl.zeros((BR, 16), dtype=tl.int32)
    acc_lo = tl.zeros((BR, 16), dtype=tl.int32)
    for kk in tl.static_range(0, KW, BK):
        kb = kk + tl.arange(0, BK)
        offs = rows[:, None] * KW + kb[None, :]
        if MASKED:
            v = tl.load(base + offs, mask=offs < left, other=0)
        else:
            v = tl.load(base + offs)
        if CAST == 1:
            b = v.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
            b = tl.where(v != v, 0x7FC0, b).to(tl.int32)
            w = tl.where(b >= 0x8000, b - 0x10000, b)
        else:
            w = v.to(tl.int32)
        hi = (w >> 8).to(tl.int8)
        lo = ((w & 0xFF) - 128).to(tl.int8)
        p = tl.load(P8 + kb[:, None] * 16 + cols[None, :])
        acc_hi = tl.dot(hi, p, acc_hi, out_dtype=tl.int32)
        acc_lo = tl.dot(lo, p, acc_lo, out_dtype=tl.int32)
    psum = tl.load(PSUM + cols).to(tl.int64)
    s = acc_hi.to(tl.int64) * 256 + acc_lo.to(tl.int64) + 128 * psum[None, :]
    q = tl.load(Q + (r0 + rows)[:, None] * NC + cols[None, :], mask=cols[None, :] < NC, other=0).to(tl.int64)
    tl.store(out + pid * NC + cols, tl.sum(s * q, axis=0), mask=cols < NC)


def sources(pieces, dtypes):
    """``{cast: [(index, flat source)]}`` as ``digest._triton_many`` groups them."""
    groups: dict = {}
    for i, (t, d) in enumerate(zip(pieces, dtypes)):
        t = digest._prepared(t)
        got = digest._triton_source(t, d or t.dtype)
        assert got is not None, "every bench piece takes the triton route"
        groups.setdefault(got[1], []).append((i, got[0]))
    return groups


class Launch:
    """One variant's launches for one call: per source kind, an unmasked launch over the full
    blocks of every piece and a masked one over the tails, split by the pointers' alignment."""

    def __init__(self, kind: str, br: int, warps: int, bk: int = 128):
        self.kind, self.br, self.warps, self.bk = kind, br, warps, bk
        self.cache: dict = {}

    def tables(self, members, device):
        key = tuple((src.data_ptr(), src.numel()) for _, src in members)
        got = self.cache.get(key)
        if got is not None:
            return got
        per = self.br * K
        launches = []
        for aligned in (True, False):
            for masked in (False, True):
                prog_piece, prog_row = [], []
                for j, (_, src) in enumerate(members):
                    if (src.data_ptr() % 16 == 0) != aligned:
                        continue
                    n = src.numel()
                    full = n // per
                    blocks = range(full) if not masked else ([full] if n % per or n == 0 else [])
                    for b in blocks:
                        prog_piece.append(j)
                        prog_row.append(b * self.br)
                if prog_piece:
                    launches.append((aligned, masked, torch.tensor(prog_piece, device=device),
                                     torch.tensor(prog_row, dtype=torch.int64, device=device)))
        ptrs = torch.tensor([src.data_ptr() for _, src in members], dtype=torch.int64, device=device)
        nels = torch.tensor([src.numel() for _, src in members], dtype=torch.int64, device=device)
        index = torch.cat([lp for *_, lp, _ in launches])
        got = self.cache[key] = (ptrs, nels, launches, index)
        return got

    def __call__(self, pieces, dtypes):
        out = [None] * len(pieces)
        groups = sources(pieces, dtypes)
        for cast, members in groups.items():
            device = members[0][1].device
            ptrs, nels, launches, index = self.tables(members, device)
            rows = max(src.numel() for _, src in members) // K + self.br + 1
            p, q = digest.tables(device, rows)
            partial = torch.empty(int(index.numel()), NC, dtype=torch.int64, device=device)
            pos = 0
            for aligned, masked, bpiece, brow in launches:
                n = int(bpiece.numel())
                view = partial[pos:pos + n]
                self.launch(cast, masked, aligned, ptrs, nels, bpiece, brow, p, q, view, n, device)
                pos += n
            sums = torch.zeros(len(members), NC, dtype=torch.int64, device=device).index_add_(0, index, partial)
            for row, (i, _) in enumerate(members):
                out[i] = sums[row:row + 1]
        return out

    def launch(self, cast, masked, aligned, ptrs, nels, bpiece, brow, p, q, out, n, device):
        if self.kind in ("v1", "read"):
            pt = _pt(p, device)
            fold_v1[(n,)](ptrs, nels, bpiece, brow, pt, q, out, KW=K, BR=self.br, NC=NC, CAST=cast, MASKED=masked,
                          ALIGN=aligned, MODE=1 if self.kind == "read" else 0, num_warps=self.warps)
        else:
            p8, psum = _p8(p, device)
            fold_mma[(n,)](ptrs, nels, bpiece, brow, p8, psum, q, out, KW=K, BR=self.br, NC=NC, CAST=cast,
                           MASKED=masked, ALIGN=aligned, BK=self.bk, num_warps=self.warps)


_pts: dict = {}


def _pt(p, device):
    key = ("pt", str(device))
    if key not in _pts:
        _pts[key] = p.t().contiguous()
    return _pts[key]


def _p8(p, device):
    key = ("p8", str(device))
    if key not in _pts:
        p8 = torch.zeros(K, 16, dtype=torch.int8, device=device)
        p8[:, :NC] = p.to(torch.int8)
        psum = torch.zeros(16, dtype=torch.int32, device=device)
        psum[:NC] = p.sum(0).to(torch.int32)
        _pts[key] = (p8, psum)
    return _pts[key]


def variants(small: bool) -> dict:
    out = {"v0": None}
    for br in ((4,) if small else (4, 8, 16)):
        for warps in ((4,) if small else (4, 8)):
            out[f"v1-br{br}-w{warps}"] = Launch("v1", br, warps)
    out["read-br8-w4"] = Launch("read", 8 if not small else 4, 4)
    for br in ((16,) if small else (16, 32, 64)):
        for bk in ((128,) if small else (128, 256)):
            out[f"mma-br{br}-bk{bk}-w4"] = Launch("mma", br, 4, bk)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated variant names")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type != "cuda":
        digest.TRITON_DEVICES = (*digest.TRITON_DEVICES, device.type)
    digest.ROUTE = "triton"
    reps = args.reps or (2 if args.small else 11)
    engine, trainer = micro.build(micro.SMALL if args.small else micro.WIDE, device)
    bf = [torch.bfloat16] * len(trainer)
    nbytes = sum(t.numel() * t.element_size() for t in engine + trainer)
    bw = micro.bandwidth(device, min(4 << 30, max(1 << 24, nbytes // 2)))
    floor = nbytes / bw
    print(f"{len(engine)} pieces, {nbytes / 1e9:.2f} GB, bandwidth {bw / 1e9:.0f} GB/s, floor {floor * 1e3:.2f} ms",
          flush=True)
    want = digest.collect(digest.partials_many(engine) + digest.partials_many(trainer, bf))
    rows = []
    for name, fn in variants(args.small).items():
        if args.only and name not in args.only.split(","):
            continue
        row = {"variant": name}
        try:
            if fn is None:
                def fn(pieces, dtypes):
                    return digest.partials_many(pieces, dtypes)
            got = digest.collect(fn(engine, [None] * len(engine)) + fn(trainer, bf))
            if name.startswith("read"):
                row["equal"] = None
            else:
                row["equal"] = got == want
                if not row["equal"]:
                    row["differ"] = sum(a != b for a, b in zip(got, want))

            def check(k=0, fn=fn):
                digest.collect(fn(engine, [None] * len(engine)) + fn(trainer, bf))
            med, best = micro.timed(check, device, reps)
            row.update(ms=med * 1e3, best_ms=best * 1e3, gbps=nbytes / med / 1e9, x_floor=med / floor)
            if device.type == "cuda":
                from triton.testing import do_bench
                row["engine_ms"] = do_bench(lambda: fn(engine, [None] * len(engine)), warmup=5, rep=50)
                row["trainer_ms"] = do_bench(lambda: fn(trainer, bf), warmup=5, rep=50)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()
        print(json.dumps(row), flush=True)
        rows.append(row)
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                digest.collect(digest.partials_many(engine) + digest.partials_many(trainer, bf))
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "triton": triton.__version__, "bytes": nbytes,
              "bandwidth_gbps": bw / 1e9, "floor_ms": floor * 1e3, "rows": rows}
    out = os.environ.get("OUT")
    if out and not args.small:
        with open(os.path.join(out, "gpu_digest_kernels.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
