#!/usr/bin/env bash
# Builds what it needs and runs the store benchmark (bench/store_bench.cc):
# c10d's stock TCPStore client (libtorch 2.15 from the venv's torch wheel)
# against meshrun-rdzvd's TCPStore endpoint and against torch's own libuv
# TCPStore server, and meshrun's gRPC store client and rendezvous beside them;
# then records the results in bench/results/store.md (+ store.json).
#
#   scripts/bench-store.sh                     # everything, ~8-10 minutes
#   scripts/bench-store.sh --sections ops --reps 1 --duration-ms 1000   # quick look
#   scripts/bench-store.sh --meshrun-tcpstore-server torch   # A/A: the harness's noise
#   scripts/bench-store.sh --etcd              # the daemon on etcd against one without
#                                              # (bench/results/store-etcd.md, ~3 minutes)
#
# It runs in a network namespace of its own with only a loopback device, when
# it may (root: unshare --net): all traffic stays on 127.0.0.1. c10d's client
# looks up its socket's host name on every connect (for a log line); on a
# machine whose resolver points at a name server, thousands of clients
# connecting at once then wait for DNS (5 s timeouts), which swamped the
# connect times (and sent queries off the machine). Without a route the
# look-up fails at once. NO_NETNS=1 runs it in the machine's namespace.
#
# Extra arguments go to store_bench (see `store_bench --help`). Environment:
#   BUILD_DIR    build directory (default build/; configured if missing)
#   RESULTS_DIR  where store.md and store.json go (default bench/results)
#   MESHRUN_VENV the virtualenv with the pinned torch (default .venv)
#   WAIT_QUIET   seconds to wait for the 1-minute load average to drop below
#                half the cores before starting (default 0: just warn)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/results}
wait_quiet=${WAIT_QUIET:-0}

if [ ! -f "$build_dir/build.ninja" ]; then
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DMESHRUN_BUILD_BENCH=ON > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
fi
ninja -C "$build_dir" store_bench meshrun-rdzvd
bench="$build_dir/bin/store_bench"
[ -x "$bench" ] || { echo "bench-store: $bench was not built (MESHRUN_BUILD_BENCH=ON?)" >&2; exit 1; }

source scripts/lib/bench-common.sh
find_torch bench-store
wait_for_quiet bench-store "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --etcd (issue 47): what keeping the daemon's state in etcd costs the store.
# Workers' traffic through agents' relays (8 clients a relay), 64 clients'
# ops/s and a 1,000-rank barrier, once against a daemon without a state medium
# and once against a daemon on a one-member etcd (started here, in the same
# namespace of its own), each beside torch's server as in the full run.
if [ "${1:-}" = "--etcd" ]; then
  shift
  command -v etcd > /dev/null || { echo "bench-store: --etcd needs etcd (etcd-server)" >&2; exit 1; }
  unshare --net -- true 2>/dev/null ||
    { echo "bench-store: --etcd needs a network namespace of its own (root)" >&2; exit 1; }
  common=(--sections ops,barrier --ops-clients 64 --barrier-sizes 1000 --meshrun-via-relays 8 "$@")
  started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
  t0=$(date +%s)
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  # shellcheck disable=SC2016
  unshare --net -- sh -c '
    ip link set lo up
    dir=$1 bench=$2
    shift 2
    etcd --data-dir "$dir/etcd" --listen-client-urls http://127.0.0.1:2379 \
      --advertise-client-urls http://127.0.0.1:2379 > "$dir/etcd.log" 2>&1 &
    etcd=$!
    "$bench" --json "$dir/single.json" "$@" > "$dir/single.out" &&
      "$bench" --json "$dir/etcd.json" --rdzvd-etcd 127.0.0.1:2379 "$@" > "$dir/etcd.out"
    status=$?
    kill "$etcd"
    exit "$status"' sh "$tmp" "$bench" "${common[@]}" 2> "$tmp/stderr" ||
    { tail -20 "$tmp/stderr" >&2; exit 1; }
  {
    echo "# Store benchmark: meshrun-rdzvd with its state in etcd against one without"
    echo
    echo "Produced by \`scripts/bench-store.sh --etcd\` (bench/store_bench.cc); do not edit by hand."
    echo
    echo "- Command: \`scripts/bench-store.sh --etcd${*:+ $*}\`: store_bench ${common[*]}, then the same with --rdzvd-etcd"
    echo "- Date: $started (took $(( $(date +%s) - t0 )) s)"
    machine_line
    echo "- meshrun: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (+ uncommitted changes)'); etcd $(etcd --version | head -1 | awk '{print $3}'), one member on 127.0.0.1, in a network namespace of its own"
    echo "- Load average before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "## Results (medians; c10d's TCPStore client through meshrun's relays)"
    echo
    "$venv_python" - "$tmp/single.json" "$tmp/etcd.json" <<'PY'
import json
import sys

single, etcd = (json.load(open(path)) for path in sys.argv[1:3])


def cell(doc: dict, section: str, key: str, size: int) -> dict:
    return next(c for c in doc["cells"] if c["section"] == section and c.get(key) == size)


print("| measure | no state medium | on etcd | etcd / none | torch's server (etcd run) |")
print("|---|---:|---:|---:|---:|")
a, b = cell(single, "ops", "clients", 64), cell(etcd, "ops", "clients", 64)
print(f"| ops/s, 64 clients | {a['meshrun_ops_per_s']:.0f} | {b['meshrun_ops_per_s']:.0f} "
      f"| {b['meshrun_ops_per_s'] / a['meshrun_ops_per_s']:.2f} | {b['libuv_ops_per_s']:.0f} |")
a, b = cell(single, "barrier", "n", 1000), cell(etcd, "barrier", "n", 1000)
print(f"| 1,000-rank barrier (s) | {a['meshrun_s']:.3f} | {b['meshrun_s']:.3f} "
      f"| {b['meshrun_s'] / a['meshrun_s']:.2f} | {b['libuv_s']:.3f} |")
PY
    echo
    echo "Every set, add and compare_set is in etcd (one transaction a flush) before it is"
    echo "answered; gets and waits are answered after the writes before them are."
  } > "$results_dir/store-etcd.md"
  echo "bench-store: wrote $results_dir/store-etcd.md" >&2
  exit 0
fi

cmd=("$bench" --json "$results_dir/store.json" "$@")
run=("${cmd[@]}")
netns="the machine's own (NO_NETNS=1 or unshare --net unavailable)"
if [ -z "${NO_NETNS:-}" ] && unshare --net -- true 2>/dev/null; then
  run=(unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh "${cmd[@]}")
  netns="one of its own with only loopback (unshare --net): no traffic leaves 127.0.0.1"
fi
invocation="scripts/bench-store.sh${*:+ $*}"
for var in NO_NETNS WAIT_QUIET MESHRUN_VENV RESULTS_DIR BUILD_DIR; do
  [ -n "${!var:-}" ] && invocation="$var=${!var} $invocation"
done
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
t0=$(date +%s)
status=0
# Progress (stderr) goes to the terminal and the log; tables (stdout) likewise.
"${run[@]}" > >(tee "$tmp/stdout") 2> >(tee "$tmp/stderr" >&2) || status=$?
wait
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

{
  echo "# Store benchmark: c10d's TCPStore client against meshrun-rdzvd and against torch's libuv TCPStore server"
  echo
  echo "Produced by \`scripts/bench-store.sh\` (bench/store_bench.cc); do not edit by hand."
  echo
  echo "- Command: \`$invocation\`, which ran \`${cmd[*]}\`"
  echo "- Date: $started (took $(( $(date +%s) - t0 )) s)"
  machine_line
  echo "- meshrun: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)'), built in $build_dir;" \
       "gRPC $(dpkg-query -W -f='${Version}' libgrpc++-dev 2>/dev/null || echo '?')"
  echo "- Client and peer server: c10d::TCPStore of torch $torch_version's libtorch (the venv's" \
       "wheel, $python_version); the peer server is its libuv backend (torch 2's default; the" \
       "server refuses to start otherwise)"
  echo "- Network namespace: $netns"
  echo "- Load average (1/5/15 min) before: $load_before; after: $load_after"
  echo "- Exit status: $status"
  if awk -v l="${load_before%% *}" -v n="$ncores" 'BEGIN { exit !(l > n / 2) }'; then
    echo "- Note: the machine was loaded by other work while this ran (see the load" \
         "averages); absolute numbers are low and noisy, the side-by-side ratios less so."
  fi
  echo
  echo "## Results"
  echo
  echo '```'
  grep -v '^SUMMARY_JSON ' "$tmp/stdout" || true
  echo '```'
  echo
  echo "## Raw output"
  echo
  echo "Per-run log (stderr) followed by the machine-readable summary line (stdout)."
  # libtorch's TCPStore logs each of its thousands of storm and barrier clients
  # that fails to connect or is dropped, with a C++ stack (5 MB a run): counted
  # here, not copied.
  c10d_log='^(\[[WEI][0-9]{4} [0-9:.]+ [A-Za-z]+\.cpp:[0-9]+\]|Exception raised from |frame #[0-9]+: |$)'
  echo "libtorch's own log lines (TCPStore client warnings and their stacks) left out:" \
       "$(grep -cE "$c10d_log" "$tmp/stderr" || true)."
  echo
  echo '```'
  grep -vE "$c10d_log" "$tmp/stderr" || true
  grep '^SUMMARY_JSON ' "$tmp/stdout" || true
  echo '```'
} > "$results_dir/store.md"
echo "bench-store: wrote $results_dir/store.md and $results_dir/store.json" >&2
exit "$status"
