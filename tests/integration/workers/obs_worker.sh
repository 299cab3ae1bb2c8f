#!/bin/sh
# A worker for the observability tests (run with meshrun --no-python):
#   obs_worker.sh STORE_TOOL DIR
# Every rank sets "up<RANK>" in its round's store and waits for "up0" (real
# store ops for the metrics), then prints "ready". In attempt 0, global rank
# $FAIL_RANK (default 3) fails once DIR/fail exists: it runs the Python
# script $FAIL_PY (a traceback through torch's @record) if set, else exits 3;
# the other ranks wait to be stopped. In later attempts every rank exits 0
# once DIR/finish exists. Each wait gives up after 120 s.
tool=$1
dir=$2
wait_for() {
  i=0
  while [ ! -e "$1" ]; do
    i=$((i + 1))
    [ "$i" -gt 2400 ] && { echo "obs_worker: $1 never appeared" >&2; exit 22; }
    sleep 0.05
  done
}
"$tool" "$MESHRUN_STORE_ENDPOINT" "$MESHRUN_STORE_PREFIX" set "up$RANK" 1 >/dev/null || exit 20
"$tool" "$MESHRUN_STORE_ENDPOINT" "$MESHRUN_STORE_PREFIX" wait up0 60000 >/dev/null || exit 21
echo "rank=$RANK attempt=$TORCHELASTIC_RESTART_COUNT ready"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = "${FAIL_RANK:-3}" ]; then
    wait_for "$dir/fail"
    [ -n "$FAIL_PY" ] && exec "${PYTHON_EXEC:-python3}" "$FAIL_PY"
    exit 3
  fi
  exec sleep 120
fi
wait_for "$dir/finish"
echo "rank=$RANK attempt=$TORCHELASTIC_RESTART_COUNT done"
