#!/bin/sh
# Worker for the restart benchmark (run with --no-python).
#   fail_once.sh once    rank 0 exits 1 in attempt 0 (TORCHELASTIC_RESTART_COUNT=0), else exit 0
#   fail_once.sh never   exit 0 (the clean baseline: same script, same exec cost)
if [ "$1" = once ] && [ "$RANK" = 0 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  exit 1
fi
exit 0
