#!/usr/bin/env bash
# Builds the wheel folder that ms-swift 4.6.0 needs on the H200 (issue 13), default .gpu/swift-wheels
# (git-ignored: never commit wheels). Carried to the GPU machine with the device tool's `carry`, and
# installed there by tests/gpu/run_swift.sh (pip install --no-index --no-deps --target /tmp/sw).
#
#   bash tests/gpu/swift_wheels.sh [OUT_DIR]         # about 24 MiB, 1 minute (needs the package index)
#
# 1. the pinned wheels of tests/gpu/swift_wheels.txt (pip download --no-deps --only-binary=:all:,
#    CPython 3.12, manylinux x86_64); 2. deepspeed 0.19.8 (an sdist) built as a py3-none-any wheel with
#    DS_BUILD_OPS=0 (no compiled ops: JIT at run time if ever needed; ZeRO-2/3 need none) by a Python that
#    has torch (PYTHON_WITH_TORCH, default .envs/swift-4.6.0/bin/python; --no-build-isolation so pip
#    does not fetch a torch into an isolated build env); 3. a check that every pin is there, SHA256SUMS.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${1:-$REPO/.gpu/swift-wheels}
PY=${PYTHON:-python3}
PYT=${PYTHON_WITH_TORCH:-$REPO/.envs/swift-4.6.0/bin/python}
case "$OUT" in "$REPO"/*) (cd "$REPO" && git check-ignore -q "${OUT#"$REPO"/}") \
  || { echo "swift_wheels.sh: $OUT is not git-ignored (a device run would carry it as part of the checkout)" >&2; exit 2; };; esac
mkdir -p "$OUT"
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 --platform any)
grep -v -E '^\s*(#|$)' "$REPO/tests/gpu/swift_wheels.txt" > "$OUT/.pins"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  -d "$OUT" -r "$OUT/.pins"
if ! ls "$OUT"/deepspeed-0.19.8-py3-none-any.whl >/dev/null 2>&1; then
  "$PYT" -c "import torch" 2>/dev/null || { echo "swift_wheels.sh: $PYT has no torch (set PYTHON_WITH_TORCH)" >&2; exit 1; }
  DS_BUILD_OPS=0 "$PYT" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" deepspeed==0.19.8
fi
echo deepspeed==0.19.8 >> "$OUT/.pins"
"$PY" - "$OUT" <<'PYEOF' || exit 1
import os, re, sys
out = sys.argv[1]
norm = lambda n: re.sub(r"[-_.]+", "_", n).lower()
have = {(norm(f.split("-")[0]), f.split("-")[1]) for f in os.listdir(out) if f.endswith(".whl")}
pins = [l.strip() for l in open(os.path.join(out, ".pins")) if l.strip()]
missing = [p for p in pins if (norm(p.split("==")[0]), p.split("==")[1]) not in have]
for p in missing:
    print("missing:", p, file=sys.stderr)
sys.exit(1 if missing else 0)
PYEOF
rm -f "$OUT/.pins"
(cd "$OUT" && sha256sum ./*.whl > SHA256SUMS)
echo "$(ls "$OUT"/*.whl | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
