#!/usr/bin/env bash
# Builds and runs the soak test (tests/soak/soak_main.cc) and records its
# figures in bench/results/soak.md: load held, faults injected, jobs
# completed, daemon memory over time.
#
#   scripts/soak.sh                          # 5 minutes of faults, the recorded run
#   scripts/soak.sh --duration-s 60 --runs 4 # shorter (as in ctest's soak_test)
#
# Extra arguments go to meshrun_soak (see `meshrun_soak --help`). Environment:
#   BUILD_DIR    build directory (default build/; configured if missing)
#   RESULTS_DIR  where soak.md goes (default bench/results)
#   WAIT_QUIET   seconds to wait for a quiet machine first (default 0)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/results}
if [ ! -f "$build_dir/build.ninja" ]; then
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
fi
ninja -C "$build_dir" meshrun_soak meshrun meshrun-rdzvd
source scripts/lib/bench-common.sh
wait_for_quiet soak "${WAIT_QUIET:-0}"

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--duration-s 300 --runs 6 --store-procs 4 --clients-per-proc 500)
mkdir -p "$results_dir"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
mark_start  # tree (the commit) and started, before the run rewrites the results
status=0
"$build_dir/bin/meshrun_soak" "${args[@]}" | tee "$out" || status=$?
{
  echo "# Soak test: meshrun-rdzvd under load and injected faults"
  echo
  echo "Produced by \`scripts/soak.sh\` (tests/soak/soak_main.cc); do not edit by hand."
  echo
  echo "- Command: \`meshrun_soak ${args[*]}\`"
  echo "- Date: $started"
  machine_line
  echo "- meshrun: $tree, built in $build_dir"
  echo "- Load average (1/5/15 min) before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- Exit status: $status (0 = every criterion met)"
  echo
  echo "What runs: the real daemon; jobs of 3 real \`meshrun\` agents (--nnodes 2:3) whose"
  echo "workers are real processes; store-client processes with hundreds of clients each"
  echo "(a quarter on connections of their own, re-connecting every 10-60 s); faults at"
  echo "random every ~1.5 s: an agent SIGKILLed or SIGTERMed (a fresh agent joins in its"
  echo "place), a worker SIGKILLed (the job restarts), and every 20 s a whole store process"
  echo "SIGKILLed. Then no more faults, and every job must finish. Pass criteria: the daemon"
  echo "is alive, every agent not killed on purpose exits 0, every job finishes, store"
  echo "clients see no unexpected error, and the daemon's heap in use (from its /metrics)"
  echo "over the last fifth of the fault phase is within the allowed growth of the second"
  echo "fifth's. The RSS is shown, not judged: glibc keeps each arena's high-water mark, so"
  echo "it ratchets up with bursts of reconnecting clients while the heap in use falls back."
  echo
  echo '```'
  cat "$out"
  echo '```'
} > "$results_dir/soak.md"
echo "soak: wrote $results_dir/soak.md" >&2
exit "$status"
