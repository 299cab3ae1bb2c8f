#!/usr/bin/env bash
# Runs the launcher benchmark: meshrun against torchrun 2 (the project's venv,
# torch 2.15, see scripts/check-venv.sh) side by side, and records the
# results in bench/launcher/results.md (+ results.json). See
# bench/launcher/bench_launcher.py for what is measured and how.
#
#   scripts/bench-launcher.sh                          # everything, ~3-5 minutes
#   scripts/bench-launcher.sh --sections launch --runs 3   # quick look
#
# Extra arguments go to bench_launcher.py (--runs, --meshrun-repeats,
# --sections launch,restart,loss, --loss-trials-meshrun, --loss-trials-torchrun,
# --loss-wait). Environment:
#   BUILD_DIR    build directory (default build/; configured if missing)
#   RESULTS_DIR  where results.md and results.json go (default bench/launcher)
#   MESHRUN_VENV the virtualenv with the pinned torch (default .venv)
#   TORCHRUN     the peer (default $MESHRUN_VENV/bin/torchrun)
#   WAIT_QUIET   seconds to wait for the 1-minute load average to drop below
#                half the cores before starting (default 0: just warn)
#   WHEEL        a pip wheel (scripts/build-wheel.sh): (a) runs its meshrun
#                beside the source build's and compares them
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/launcher}
wait_quiet=${WAIT_QUIET:-0}

if [ ! -f "$build_dir/build.ninja" ]; then
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja -DMESHRUN_BUILD_BENCH=OFF > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
fi
ninja -C "$build_dir" meshrun meshrun-rdzvd >&2

source scripts/lib/bench-common.sh
find_torch bench-launcher
torchrun=${TORCHRUN:-$venv_torchrun}
[ -x "$torchrun" ] || { echo "bench-launcher: peer $torchrun not found (set TORCHRUN)" >&2; exit 1; }
wait_for_quiet bench-launcher "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheel_args=()
if [ -n "${WHEEL:-}" ]; then
  # The wheel's meshrun as pip installs it: the file from its scripts, executable.
  "$venv_python" -m zipfile -e "$WHEEL" "$tmp/wheel"
  wheel_meshrun=$(echo "$tmp"/wheel/meshrun-*.data/scripts/meshrun)
  [ -f "$wheel_meshrun" ] || { echo "bench-launcher: no meshrun in $WHEEL" >&2; exit 1; }
  chmod +x "$wheel_meshrun"
  wheel_args=(--meshrun-wheel "$wheel_meshrun")
fi
cmd=("$venv_python" bench/launcher/bench_launcher.py
     --meshrun "$build_dir/bin/meshrun" --rdzvd "$build_dir/bin/meshrun-rdzvd"
     --torchrun "$torchrun" --python "$venv_python" --json "$results_dir/results.json"
     "${wheel_args[@]}" "$@")
# The invocation as typed, with the settings that came from the environment.
invocation="scripts/bench-launcher.sh${*:+ $*}"
for var in WAIT_QUIET TORCHRUN MESHRUN_VENV RESULTS_DIR BUILD_DIR WHEEL; do
  [ -n "${!var:-}" ] && invocation="$var=${!var} $invocation"
done
started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
t0=$(date +%s)
run_driver "${cmd[@]}"
cat "$tmp/stdout"

{
  echo "# Launcher benchmark: meshrun vs torchrun"
  echo
  echo "Produced by \`scripts/bench-launcher.sh\` (bench/launcher/bench_launcher.py); do not edit by hand."
  echo
  echo "- Command: \`$invocation\`, which ran \`${cmd[*]}\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)'), built in $build_dir"
  echo "- Peer: torchrun of torch $torch_version ($torchrun, $python_version); its c10d" \
       "rendezvous store is torch's TCPStore with its default libuv server"
  echo "- Load average (1/5/15 min) before: $load_before; after: $load_after"
  echo "- Exit status: $status"
  echo
  echo "## Method"
  echo
  echo "- (a) launch: \`--standalone\`, 4 workers running \`/bin/true\` (\`--no-python\`); torchrun with"
  echo "  \`--monitor_interval=0.1\`. Wall = \`time.perf_counter()\` from just before the launcher is"
  echo "  spawned to just after \`os.wait4()\` returns for it. Peak RSS = \`ru_maxrss\` from that"
  echo "  \`os.wait4()\`: on Linux the peak RSS of the largest *single* process among the launcher"
  echo "  and every descendant it reaped (so: the launcher; its workers are /bin/true), not a sum."
  echo "  One untimed warm-up each, then interleaved rounds (meshrun x R, torchrun, meshrun x R, ...;"
  echo "  R = --meshrun-repeats, 5 by default: a meshrun run costs ~1/50 of a torchrun run)."
  echo "- (b) restart: the same launch with \`--max-restarts=1\` and bench/launcher/fail_once.sh, in which"
  echo "  rank 0 exits 1 when TORCHELASTIC_RESTART_COUNT=0 (\`once\`); the baseline is the same"
  echo "  script never failing (\`never\`), run alternately (never, once, ...; meshrun's pairs R times"
  echo "  per round). Extra = median(once) - median(never), and, less sensitive to the load"
  echo "  drifting during the run, the median over pairs of (once - the never run just before it)."
  echo "- (c) node loss: 3 agents, \`--nnodes=2:3 --nproc-per-node=1 --max-restarts=3\`, one endpoint"
  echo "  (meshrun: a separate \`meshrun-rdzvd --port 0\`; torchrun: \`--rdzv_backend=c10d\` on a"
  echo "  kernel-chosen port, the first agent hosting the TCPStore, the other two started once it"
  echo "  listens), default keep-alive (5 s x 3). Workers (bench/launcher/node_worker.sh) print"
  echo "  \`date +%s.%N\` with restart count, world size and group rank, then sleep. Once all"
  echo "  three run in a world of 3, the third agent is SIGKILLed (0.5 s later); the time is from"
  echo "  the kill to the worker-stamped start line of each survivor's new world-2 worker. The"
  echo "  killed agent's worker is watched too (gone = exited or zombie)."
  echo
  echo "## Results"
  echo
  grep -v '^SUMMARY_JSON ' "$tmp/stdout" || true
  bench_logs
} > "$results_dir/results.md"
# The files name the checkout's paths and the wheel's extraction folder:
# neither is where a reader's are.
for results in "$results_dir/results.md" "$results_dir/results.json"; do
  strip_checkout_paths "$results"
  sed -i "s#$tmp/wheel/#<wheel>/#g" "$results"
done
echo "bench-launcher: wrote $results_dir/results.md and $results_dir/results.json" >&2
exit "$status"
