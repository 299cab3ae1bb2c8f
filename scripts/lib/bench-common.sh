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
