"""The ``triton`` digest route run by Triton's CPU interpreter (``TRITON_INTERPRET=1``): one batched
launch per kind of source over pieces of every shape that matters (several pieces per launch, ragged
tails, exactly one block, an empty piece, a non-contiguous view, float32 rounded to bfloat16 and to
float16 with round-to-nearest-even carries, overflow to inf, signed zeros), compared with the
definition; then the same pieces again (cached launch tables) after a change of ``BLOCK_ROWS`` and after
an element changed in place (``shim.verify.digest.reference``). Prints one JSON line:
``{"launches": {kind: n}, "rows": [[dtype, piece, equal], ...]}``.

  PYTHONPATH=.envs/triton-3.6.0:. TRITON_INTERPRET=1 python tests/scenarios/digest_triton_run.py
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    import torch

    from shim.verify import digest, digest_triton

    digest_triton.TRITON_DEVICES = ("cuda", "cpu")
    digest_triton.BLOCK_ROWS = 2  # several blocks per piece at these sizes
    g = torch.Generator().manual_seed(11)
    k = digest.K
    halfway = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 3.0e38, 3.4e38, -0.0, 1e-40])
    pieces = {
        "fp32 2d": torch.randn(300, 64, generator=g),
        "fp32 tiny": torch.randn(7, generator=g),
        "fp32 one block": torch.randn(2 * k, generator=g),
        "fp32 ragged": torch.randn(3 * k + 5, generator=g) * 1e3,
        "fp32 halfway": halfway.repeat(400),
        "fp32 strided": torch.randn(50, 40, generator=g)[:, :7],
        "fp32 empty": torch.randn(0),
        "bf16": torch.randn(40, 96, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(5 * k + 1, generator=g).to(torch.float16),
    }
    launches: dict = {}
    kernel = digest_triton._triton_kernel()

    class Counting:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches[str(kw["CAST"])] = launches.get(str(kw["CAST"]), 0) + 1
                return kernel[grid](*args, **kw)
            return launch

    digest_triton._kernel = Counting()
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        got = digest.collect(digest._triton_many(list(pieces.values()), [dtype] * len(pieces)))
        for (name, t), d in zip(pieces.items(), got):
            rows.append([str(dtype), name, d == digest.reference(t, dtype)])
    counted = dict(launches)
    # the launch tables are cached by the pieces' addresses and sizes: the same pieces again after a
    # change of BLOCK_ROWS, and after an element changed in place (same address), must not reuse stale ones
    same = [pieces[n] for n in ("fp32 2d", "fp32 ragged", "fp32 tiny", "bf16")]  # no copies: the same addresses
    digest.collect(digest._triton_many(same, [torch.bfloat16] * len(same)))  # tables for BLOCK_ROWS 2 cached
    digest_triton.BLOCK_ROWS = 4
    got = digest.collect(digest._triton_many(same, [torch.bfloat16] * len(same)))
    rows.append(["cached plan", "BLOCK_ROWS changed", all(d == digest.reference(t, torch.bfloat16)
                                                         for t, d in zip(same, got))])
    before = got[0]
    pieces["fp32 2d"][17, 5] += 1.0
    got = digest.collect(digest._triton_many(same, [torch.bfloat16] * len(same)))
    rows.append(["cached plan", "changed in place", got[0] != before
                 and got[0] == digest.reference(pieces["fp32 2d"], torch.bfloat16)])
    print(json.dumps({"launches": counted, "rows": rows}))


if __name__ == "__main__":
    main()
