#!/usr/bin/env bash
# Runs the worker-library benchmark (issue 4): Gloo all-reduce bus bandwidth at
# 2 and 4 ranks and DeviceMesh (2,2,2) creation time, through meshrun's store
# vs through c10d's TCPStore (libtorch 2.15 from the venv's torch wheel, its
# default libuv server), both under `meshrun --standalone`, and records
# the results in bench/worker_lib/results.md (+ results.json). See
# bench/worker_lib/bench_worker_lib.py and bench/worker_lib/pg_bench.cc for
# what is measured and how.
#
#   scripts/bench-worker-lib.sh                       # everything, ~3-6 minutes
#   scripts/bench-worker-lib.sh --rounds 1 --mesh-launches 1   # quick look
#
# Extra arguments go to bench_worker_lib.py (--ranks, --sizes, --rounds,
# --mesh-launches, --mesh-shape). Environment:
#   BUILD_DIR    build directory (default build/; configured if missing)
#   RESULTS_DIR  where results.md and results.json go (default bench/worker_lib)
#   JOBS         ninja -j (default 2)
#   MESHRUN_VENV the virtualenv with the pinned torch (default .venv)
#   WAIT_QUIET   seconds to wait for a quiet machine first (default 0: just warn)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/worker_lib}
jobs=${JOBS:-2}
wait_quiet=${WAIT_QUIET:-0}

if [ ! -f "$build_dir/build.ninja" ]; then
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
fi
ninja -C "$build_dir" -j"$jobs" pg_bench meshrun meshrun-rdzvd >&2 ||
  { echo "bench-worker-lib: cannot build pg_bench (configured with MESHRUN_BUILD_BENCH=ON?)" >&2; exit 1; }

source scripts/lib/bench-common.sh
find_torch bench-worker-lib
wait_for_quiet bench-worker-lib "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmd=("$venv_python" bench/worker_lib/bench_worker_lib.py
     --meshrun "$build_dir/bin/meshrun" --pg-bench "$build_dir/bin/pg_bench"
     --raw "$tmp/raw" "$@")
invocation="scripts/bench-worker-lib.sh${*:+ $*}"
for var in WAIT_QUIET MESHRUN_VENV JOBS RESULTS_DIR BUILD_DIR; do
  [ -n "${!var:-}" ] && invocation="$var=${!var} $invocation"
done
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
t0=$(date +%s)
run_driver "${cmd[@]}"
grep -v '^SUMMARY_JSON ' "$tmp/stdout" || true
sed -n 's/^SUMMARY_JSON //p' "$tmp/stdout" > "$results_dir/results.json"

{
  echo "# Worker library benchmark: meshrun's store vs c10d's TCPStore"
  echo
  echo "Produced by \`scripts/bench-worker-lib.sh\` (bench/worker_lib/bench_worker_lib.py,"
  echo "bench/worker_lib/pg_bench.cc); do not edit by hand."
  echo
  echo "- Command: \`$invocation\`, which ran \`${cmd[*]}\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)'), built in $build_dir"
  echo "- libtorch: torch $torch_version's (the venv's wheel, $python_version), Gloo on CPU;"
  echo "  TCPStore is its c10d::TCPStore with the default libuv server (RESULT lines: server=)"
  echo "- Load average (1/5/15 min) before: $load_before; after: $load_after"
  echo "- Exit status: $status"
  echo
  echo "## Method"
  echo
  echo "- Every launch is \`meshrun --standalone --nproc-per-node=N --no-python pg_bench ... --store S\`;"
  echo "  the only difference between the columns is the store the workers rendezvous through:"
  echo "  \`meshrun\` = meshrun-rdzvd's Store service (GrpcStore, StoreKind::kMeshrun), \`TCPStore\` ="
  echo "  c10d's TCPStore served by rank 0 on MASTER_ADDR:MASTER_PORT (StoreKind::kTcpStore), as"
  echo "  torch's env:// does."
  echo "- (1) all-reduce: InitProcessGroup(\"gloo\"), then per size 3 untimed calls and 50 (<= 16 KiB),"
  echo "  30 (256 KiB), 10 (4 MiB) or 5 (64 MiB) timed calls, each after a barrier, timed on every"
  echo "  rank with steady_clock around allreduce()->wait(); a call's time is the max over ranks;"
  echo "  per launch the median call; over launches the median. busbw = 2(n-1)/n x bytes / time."
  echo "  Launches for the two stores alternate (meshrun first, then TCPStore first, ...)."
  echo "- (2) creation: 8 ranks; each rank reads CLOCK_MONOTONIC (shared by all processes of the"
  echo "  machine) just before InitProcessGroup and just after InitDeviceMesh(\"cpu\", {2,2,2})"
  echo "  returns (3 dims x 4 groups, 12 NewGroup calls); maxima over ranks via an all-reduce."
  echo "  The headline is the longest per-rank time; it includes waiting for the slowest process"
  echo "  to start, so the last rank's start to the last finish is shown too."
  echo "  Process start-up (loading libtorch) is not included. Launches alternate between stores."
  echo
  echo "## Results"
  echo
  grep -v '^SUMMARY_JSON ' "$tmp/stdout" || true
  bench_logs "workers' RESULT lines, rank 0"
} > "$results_dir/results.md"
echo "bench-worker-lib: wrote $results_dir/results.md and $results_dir/results.json" >&2
exit "$status"
