#!/bin/sh
# Worker for the node-loss benchmark (run with --no-python): prints one start
# line with its own wall-clock timestamp, then sleeps until it is killed.
# The timestamp comes from the worker, so pipe and log latency do not count.
echo "BENCH_START t=$(date +%s.%N) pid=$$ restart=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE group_rank=$GROUP_RANK"
exec sleep "${1:-600}"
