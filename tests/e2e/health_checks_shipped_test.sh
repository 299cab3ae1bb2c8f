#!/usr/bin/env bash
# The example health checks meshrun ships (packaging/health-checks), run by
# meshrun itself through --health-check-dir: all pass on this machine (the
# disk check asked for 0 GB), and the disk check asked for more than any disk
# has keeps the node out (exit 69), naming the check and its output.
# Usage: health_checks_shipped_test.sh MESHRUN CHECKS_DIR
set -euo pipefail
meshrun=$1
checks=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT

MESHRUN_CHECK_MIN_FREE_GB=0 "$meshrun" --standalone --nproc-per-node=1 \
  --health-check-dir "$checks" --no-python true > "$out" 2>&1 || {
  cat "$out"
  echo "FAIL: the shipped checks failed on this machine"
  exit 1
}

code=0
MESHRUN_CHECK_MIN_FREE_GB=100000000 "$meshrun" --standalone --nproc-per-node=1 \
  --health-check-dir "$checks" --no-python true > "$out" 2>&1 || code=$?
if [ "$code" != 69 ] ||
  ! grep -q "before joining: health check '$checks/20-disk' failed (exit 1): .* GB free, under 100000000 GB; this node stays out" "$out"; then
  cat "$out"
  echo "FAIL: exit $code; expected 69 and the disk check named"
  exit 1
fi
echo "ok: the shipped checks pass here; a failing one keeps the node out (exit 69)"
