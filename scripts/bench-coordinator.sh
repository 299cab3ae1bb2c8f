#!/usr/bin/env bash
# The coordinator killed mid-training (issues 30, 47): meshrun-rdzvd
# --state-dir SIGKILLed and started again under meshrun.ft, the leader of two
# meshrun-rdzvd on etcd SIGKILLed (the standby takes over), against torchft's
# Lighthouse killed and started again under torchft, on the recovery benchmark's GPT
# (bench/recovery/coordinator_restart.py says what is measured); records
# bench/recovery/coordinator_results.md.
#
#   scripts/bench-coordinator.sh               # ~5 minutes on 2 cores
#   scripts/bench-coordinator.sh --rounds 1    # a look
#
# Extra arguments go to coordinator_restart.py (--systems, --sizes, --steps,
# --kill-at-step, --down, --rounds, --timeout). Environment: BUILD_DIR,
# RESULTS_DIR, JOBS, WAIT_QUIET, NO_BUILD, MESHRUN_VENV, TORCHRUN, as
# scripts/bench-recovery.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/recovery}
jobs=${JOBS:-2}
wait_quiet=${WAIT_QUIET:-60}

source scripts/lib/bench-common.sh
build_binaries bench-coordinator meshrun meshrun-rdzvd
# The gRPC stubs of the checkout's meshrun package (build/python).
[ "${NO_BUILD:-0}" = 1 ] || ninja -C "$build_dir" meshrun_python >&2
find_torch bench-coordinator
torchrun=${TORCHRUN:-$venv_torchrun}
wait_for_quiet bench-coordinator "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The checkout's meshrun package, not an installed copy.
export PYTHONPATH="$PWD/python:$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
cmd=("$venv_python" bench/recovery/coordinator_restart.py
     --meshrun "$build_dir/bin/meshrun" --torchrun "$torchrun" --log-dir "$tmp/logs" "$@")
invocation="scripts/bench-coordinator.sh${*:+ $*}"
mark_start
run_driver "${cmd[@]}"
cat "$tmp/stdout"
{
  echo "# The coordinator killed mid-training: meshrun-rdzvd --state-dir, meshrun-rdzvd replicas on etcd, torchft's Lighthouse"
  echo
  echo "Produced by \`scripts/bench-coordinator.sh\` (bench/recovery/coordinator_restart.py,"
  echo "ft_python_recovery.py, torchft_launch.py); do not edit by hand."
  echo
  echo "- Command: \`$invocation\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $tree; peer: torchft 0.2.0 with torchrun of torch $torch_version ($python_version), gloo on CPU"
  echo "- Load: \`uptime\` before: \`$uptime_before\`; load average after: $load_after."
  echo "- Exit status: $status"
  echo
  echo "## Method"
  echo
  echo "Four replica groups of one worker train the recovery benchmark's GPT"
  echo "(ft_python_recovery.py): meshrun.ft under one \`meshrun --restart-scope=replica"
  echo "--replica-size=1 --nproc-per-node=4\` on a \`meshrun-rdzvd --state-dir\`, or on two"
  echo "\`meshrun-rdzvd --etcd-endpoints\` over a one-member etcd (default 3 s lease; the job's"
  echo "\`--rdzv-endpoint\` lists both); torchft's"
  echo "Manager, DDP and Optimizer with a torchrun per group and \`torchft_lighthouse"
  echo "--min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000\`. At the line of"
  echo "step --kill-at-step the coordinator (the leading daemon) is SIGKILLed, and started"
  echo "again --down seconds later on its port (on etcd: not started again; the standby"
  echo "takes over). Columns: coordinator_restart.py's docstring."
  echo
  echo "## Results"
  echo
  cat "$tmp/stdout"
  if [ -f bench/recovery/coordinator_notes.md ]; then
    echo
    echo "## Notes (bench/recovery/coordinator_notes.md, written by hand for the run it names)"
    echo
    cat bench/recovery/coordinator_notes.md
  fi
  bench_logs
} > "$results_dir/coordinator_results.md"
echo "bench-coordinator: wrote $results_dir/coordinator_results.md" >&2
exit "$status"
