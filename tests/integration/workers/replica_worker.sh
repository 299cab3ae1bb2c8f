#!/bin/sh
# A worker for meshrun --restart-scope=replica tests (run with --no-python).
#   replica_worker.sh DIR FAIL_RANKS HOW     (FAIL_RANKS: one rank, or "1,3")
# Each incarnation appends "start pid=<pid> restarts=<MESHRUN_REPLICA_RESTARTS>
# count=<TORCHELASTIC_RESTART_COUNT> replica=<MESHRUN_REPLICA_ID>
# size=<MESHRUN_REPLICA_SIZE> scope=<MESHRUN_RESTART_SCOPE>" to DIR/<RANK>,
# and "end pid=<pid>" when it exits 0.
# HOW, for each of FAIL_RANKS:
#   kill       its first incarnation (MESHRUN_REPLICA_RESTARTS=0) SIGKILLs
#              itself once every rank has started
#   exit:CODE  the same, exiting CODE
#   kill-on:PATH  as kill, once PATH exists too
#   always:CODE  every incarnation exits CODE at once
# Every other incarnation exits 0 once each of FAIL_RANKS has started twice
# (with always:CODE it waits to be stopped). Waits give up after 60 s (exit 3).
dir=$1 fail_ranks=$(echo "$2" | tr ',' ' ') how=$3
echo "start pid=$$ restarts=${MESHRUN_REPLICA_RESTARTS-unset}" \
     "count=$TORCHELASTIC_RESTART_COUNT replica=${MESHRUN_REPLICA_ID-unset}" \
     "size=${MESHRUN_REPLICA_SIZE-unset} scope=${MESHRUN_RESTART_SCOPE-unset}" \
     >> "$dir/$RANK"

# wait_until COMMAND...: polls the condition, for at most 60 s.
wait_until() {
  tries=0
  until "$@"; do
    tries=$((tries + 1))
    if [ "$tries" -gt 1200 ]; then
      echo "replica_worker: rank $RANK timed out waiting for: $*" >&2
      exit 3
    fi
    sleep 0.05
  done
}
all_started() {
  r=0
  while [ "$r" -lt "$WORLD_SIZE" ]; do
    [ -s "$dir/$r" ] || return 1
    r=$((r + 1))
  done
}
fail_ranks_started_twice() {
  for f in $fail_ranks; do
    starts=$(grep -c '^start' "$dir/$f" 2>/dev/null)
    [ "${starts:-0}" -ge 2 ] || return 1
  done
}
failing=false
for f in $fail_ranks; do [ "$RANK" = "$f" ] && failing=true; done

if $failing; then
  case "$how" in
    always:*) exit "${how#always:}" ;;
  esac
  if [ "$MESHRUN_REPLICA_RESTARTS" = 0 ]; then
    wait_until all_started
    case "$how" in
      kill) kill -KILL $$ ;;
      kill-on:*) wait_until test -e "${how#kill-on:}"; kill -KILL $$ ;;
      exit:*) exit "${how#exit:}" ;;
    esac
  fi
fi
case "$how" in
  always:*) exec sleep 60 ;;
esac
wait_until fail_ranks_started_twice
echo "end pid=$$" >> "$dir/$RANK"
