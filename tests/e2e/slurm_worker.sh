#!/bin/sh
# A stand-in training worker for the SLURM end-to-end tests (meshrun --no-python).
#   slurm_worker.sh env                 print this worker's place in the world, exit 0
#   slurm_worker.sh fail-once RANK CODE RANK exits CODE in attempt 0; the others
#                                       wait to be restarted; attempt 1 exits 0
#   slurm_worker.sh fail-always RANK CODE RANK exits CODE in every attempt
#   slurm_worker.sh wait                print "pid=<pid>", report USR1/TERM, run until stopped
place="RANK=$RANK LOCAL_RANK=$LOCAL_RANK GROUP_RANK=$GROUP_RANK WORLD_SIZE=$WORLD_SIZE"
place="$place LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE NODEID=$SLURM_NODEID NODE=$SLURMD_NODENAME"
place="$place RUN=$TORCHELASTIC_RUN_ID ATTEMPT=$TORCHELASTIC_RESTART_COUNT JOB=$SLURM_JOB_ID"
mode=$1; shift
case "$mode" in
  env)
    echo "WORKER $place" ;;
  fail-once)
    echo "WORKER $place"
    if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
      [ "$RANK" = "$1" ] && exit "$2"
      exec sleep 60
    fi ;;
  fail-always)
    echo "WORKER $place"
    [ "$RANK" = "$1" ] && exit "$2"
    exec sleep 60 ;;
  wait)
    trap 'echo "SIGNAL USR1 rank=$RANK"' USR1
    trap 'echo "SIGNAL TERM rank=$RANK"; exit 143' TERM
    echo "WORKER pid=$$ $place"
    # sleep in the background so the traps run as soon as a signal arrives.
    while :; do sleep 1 & wait $!; done ;;
  *) echo "slurm_worker.sh: unknown mode $mode" >&2; exit 2 ;;
esac
