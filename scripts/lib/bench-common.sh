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
