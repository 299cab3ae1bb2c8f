# Sourced by scripts/bench-*.sh: shared setup of the benchmark drivers.

# wait_for_quiet NAME SECONDS: waits up to SECONDS for the 1-minute load
# average to fall below half the cores, then warns if it has not. Sets
# load_before ("1 5 15" minute load averages) and ncores for the results file.
wait_for_quiet() {
  local name=$1 wait_quiet=$2 waited=0
  ncores=$(nproc)
  busy() { awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v n="$ncores" 'BEGIN { exit !(l > n / 2) }'; }
  while busy && [ "$waited" -lt "$wait_quiet" ]; do
    sleep 10
    waited=$((waited + 10))
  done
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  if busy; then
    echo "$name: WARNING: load average $load_before on $ncores cores;" \
         "other work on this machine will distort the numbers" >&2
  fi
}

# find_torch NAME: the project's one torch, the venv's (MESHRUN_VENV, default
# .venv, as scripts/check-venv.sh and cmake/MeshrunTorch.cmake find it). Stops
# with one line when it is missing or holds another torch. Sets venv_python
# (its python3: Python workers, PYTHON_EXEC), venv_torchrun (torchrun 2, the
# peer) torch_version (e.g. 2.15.0+cu132) and python_version ("Python 3.11.2").
find_torch() {
  local name=$1 venv=${MESHRUN_VENV:-.venv} why
  why=$(bash scripts/check-venv.sh "$venv" 2>&1 >/dev/null) ||
    { echo "$name: ${why#meshrun: }" >&2; exit 1; }
  venv=$(cd "$venv" && pwd)
  venv_python=$venv/bin/python3
  venv_torchrun=$venv/bin/torchrun
  [ -x "$venv_torchrun" ] || { echo "$name: $venv has no bin/torchrun" >&2; exit 1; }
  torch_version=$("$venv_python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    { echo "$name: $venv_python cannot import torch" >&2; exit 1; }
  python_version=$("$venv_python" --version 2>&1)
}

# bench_logs [RAW_TITLE]: the results file's tail: "## Raw output (RAW_TITLE)"
# with $tmp/raw (left out without a title), then "## Progress log" with
# $tmp/stderr.
bench_logs() {
  if [ -n "${1:-}" ]; then
    echo
    echo "## Raw output ($1)"
    echo
    echo '```'
    cat "$tmp/raw" 2>/dev/null || true
    echo '```'
  fi
  echo
  echo "## Progress log"
  echo
  echo '```'
  cat "$tmp/stderr"
  echo '```'
}

# build_binaries NAME BINARY...: builds the binaries in $build_dir with ninja
# -j$jobs, configuring it first when it has no build.ninja, and again with
# MESHRUN_BUILD_BENCH=ON when one of them is not a target yet (the benchmark
# binaries). With NO_BUILD=1 (another ninja may be running there) it only
# checks that $build_dir/bin has them.
build_binaries() {
  local name=$1 binary
  shift
  if [ "${NO_BUILD:-0}" = 1 ]; then
    for binary in "$@"; do
      [ -x "$build_dir/bin/$binary" ] ||
        { echo "$name: NO_BUILD=1 but no $build_dir/bin/$binary" >&2; exit 1; }
    done
    return
  fi
  if [ ! -f "$build_dir/build.ninja" ]; then
    mkdir -p "$build_dir"
    cmake -S . -B "$build_dir" -G Ninja > "$build_dir.configure.log" 2>&1 ||
      { cat "$build_dir.configure.log"; exit 1; }
  fi
  for binary in "$@"; do
    if ! grep -q "^build $binary:\|bin/$binary:" "$build_dir/build.ninja"; then
      cmake -S . -B "$build_dir" -DMESHRUN_BUILD_BENCH=ON > "$build_dir.configure.log" 2>&1 ||
        { cat "$build_dir.configure.log"; exit 1; }
      break
    fi
  done
  ninja -C "$build_dir" -j"${jobs:-2}" "$@" >&2 ||
    { echo "$name: cannot build $*" >&2; exit 1; }
}

# mark_start: what the results file says of the run's start. Sets tree
# (HEAD's short hash, and whether the tree has uncommitted changes, taken now:
# the results file the run rewrites makes it dirty later), started (UTC),
# uptime_before, and t0 (run_driver's clock).
mark_start() {
  tree="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes in the tree)')"
  started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
  uptime_before=$(uptime)
  t0=$(date +%s)
}

# run_driver COMMAND...: runs a benchmark driver from $t0 on, its progress
# (stderr) shown live and kept in $tmp/stderr, its tables (stdout) kept in
# $tmp/stdout for the caller to show. Sets status (its exit code), elapsed
# (seconds since $t0) and load_after ("1 5 15" minute load averages).
run_driver() {
  set +e
  # A plain pipeline, so tee has finished writing before the file is read.
  { "$@" 2>&1 1>&3 3>&- | tee "$tmp/stderr" >&2; } 3> "$tmp/stdout"
  status=${PIPESTATUS[0]}
  set -e
  # Recorded results name paths from the checkout, never this machine's.
  sed -i "s#$PWD/##g" "$tmp/stdout"
  elapsed=$(( $(date +%s) - t0 ))
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
}

# strip_checkout_paths FILE: a results file names paths from the checkout,
# never this machine's (the venv's python and the drivers' commands are
# absolute in the facts and the raw lines; DocsTest.paths checks).
strip_checkout_paths() {
  sed -i "s#$PWD/##g" "$1"
}

# machine_line: the results file's "- Machine: ..." line.
machine_line() {
  local cpu mem
  cpu=$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)
  mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
  echo "- Machine: nproc=$(nproc), $cpu, $mem RAM, Linux $(uname -r)"
}
