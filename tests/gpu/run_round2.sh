#!/usr/bin/env bash
# Every round-2 figure (issue 13) in one command on the GPU machine, after the bundle parts and the
# ms-swift wheels were carried (tests/gpu/README.md): ms-swift 4.6.0 GRPO (full and LoRA, levels 1 and 2,
# with and without the shim) and GKD through the shim (run_swift.sh), then the level-2 sleep/wake cost,
# weight verification and the #5312 rerun (run_all.sh). About 17 minutes on an H200: over the device
# tool's 10-minute call, so the recorded run split it as PART=swift-full, swift-lora-gkd, trl (one call each).
#
#   bash tests/gpu/run_round2.sh OUT_DIR            # all of it
#   PART=swift-full bash tests/gpu/run_round2.sh OUT  # one call's share
set -u
OUT=${1:-${OUT:-/tmp/shim-round2}}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PART=${PART:-all}
rc=0
if [ "$PART" = all ] || [ "$PART" = swift-full ]; then
  PHASES=grpo TUNERS=full bash "$HERE/run_swift.sh" "$OUT" || rc=1
fi
if [ "$PART" = all ] || [ "$PART" = swift-lora-gkd ]; then
  PHASES="grpo gkd" TUNERS=lora GKD_SHIMS=${GKD_SHIMS:-on} BUDGET_S=${BUDGET_S:-560} bash "$HERE/run_swift.sh" "$OUT" || rc=1
fi
if [ "$PART" = all ] || [ "$PART" = trl ]; then
  PHASES="sleep verify trl5312" RUN_EXAMPLE=0 BUDGET_S=${BUDGET_S:-560} bash "$HERE/run_all.sh" "$OUT" || rc=1
fi
exit $rc
