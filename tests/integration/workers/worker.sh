#!/bin/sh
# A fast stand-in for a training worker (run with meshrun --no-python).
#   worker.sh env                      print the torchrun variables, exit 0
#   worker.sh fail-once RANK CODE      RANK exits CODE in attempt 0, else exit 0
#   worker.sh fail-always RANK CODE    RANK exits CODE in every attempt
#   worker.sh wait-world N             exit 0 once WORLD_SIZE >= N, else wait to be restarted
#   worker.sh until-world-below N      print "pid=<pid>"; exit 0 once WORLD_SIZE < N, else wait
#   worker.sh sleep SECONDS            print "pid=<pid>" and sleep
#   worker.sh args ARGS...             print each argument on its own line
mode=$1; shift
tag="rank=$RANK attempt=$TORCHELASTIC_RESTART_COUNT"
case "$mode" in
  env)
    for k in LOCAL_RANK RANK GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME \
             ROLE_WORLD_SIZE LOCAL_WORLD_SIZE WORLD_SIZE MASTER_ADDR MASTER_PORT \
             TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID \
             TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS \
             MESHRUN_STORE_ENDPOINT MESHRUN_STORE_PREFIX; do
      eval "v=\${$k-<unset>}"
      echo "ENV $RANK $k=$v"
    done ;;
  fail-once)
    echo "$tag started"
    if [ "$RANK" = "$1" ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit "$2"; fi
    echo "$tag done" ;;
  fail-always)
    echo "$tag started"
    if [ "$RANK" = "$1" ]; then exit "$2"; fi
    # The others wait to be stopped.
    exec sleep 60 ;;
  wait-world)
    echo "$tag world=$WORLD_SIZE"
    if [ "$WORLD_SIZE" -ge "$1" ]; then echo "$tag done"; exit 0; fi
    exec sleep 60 ;;
  until-world-below)
    echo "pid=$$ $tag world=$WORLD_SIZE"
    if [ "$WORLD_SIZE" -lt "$1" ]; then echo "$tag done"; exit 0; fi
    exec sleep 60 ;;
  sleep)
    echo "pid=$$ $tag"
    exec sleep "$1" ;;
  args)
    for a in "$@"; do echo "ARG[$a]"; done ;;
  *) echo "worker.sh: unknown mode $mode" >&2; exit 2 ;;
esac
