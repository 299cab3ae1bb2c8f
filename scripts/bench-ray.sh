#!/usr/bin/env bash
# meshrun --ray against Ray Train's TorchTrainer (issue 31): seed 003's TP + PP
# function as a training loop on one Ray cluster of three 2-CPU nodes started
# on this machine, in a network and PID namespace of its own; time from the
# command to the first step, and back to training after a Ray node is killed
# (its raylet and all it started; bench/ray/bench_ray.py says what is measured). Installs Ray
# Train's packages into the venv (scripts/bench-requirements.txt); records
# bench/ray/results.md.
#
#   scripts/bench-ray.sh               # 3 rounds, ~6 minutes on 2 cores
#   scripts/bench-ray.sh --rounds 1    # a look
#
# Extra arguments go to bench_ray.py (--rounds, --timeout). Environment:
# BUILD_DIR, RESULTS_DIR, JOBS, WAIT_QUIET, NO_BUILD, MESHRUN_VENV, as
# scripts/bench-recovery.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/ray}
jobs=${JOBS:-2}
wait_quiet=${WAIT_QUIET:-60}

source scripts/lib/bench-common.sh
build_binaries bench-ray meshrun meshrun-rdzvd
[ "${NO_BUILD:-0}" = 1 ] || ninja -C "$build_dir" meshrun_python >&2
find_torch bench-ray
"$venv_python" -m pip install -q -r scripts/bench-requirements.txt >&2
ray_version=$("$venv_python" -c 'import ray; print(ray.__version__)')
wait_for_quiet bench-ray "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The checkout's meshrun package, not an installed copy.
export PYTHONPATH="$PWD/python:$PWD/$build_dir/python${PYTHONPATH:+:$PYTHONPATH}"
cmd=(unshare --net --pid --fork --mount-proc "$venv_python" bench/ray/bench_ray.py
     --meshrun "$PWD/$build_dir/bin/meshrun" --log-dir "$tmp/logs" "$@")
invocation="scripts/bench-ray.sh${*:+ $*}"
mark_start
run_driver "${cmd[@]}"
cat "$tmp/stdout"
{
  echo "# meshrun --ray vs Ray Train's TorchTrainer"
  echo
  echo "Produced by \`scripts/bench-ray.sh\` (bench/ray/bench_ray.py, seed003_train.py);"
  echo "do not edit by hand."
  echo
  echo "- Command: \`$invocation\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $tree; peer: Ray Train $ray_version (TorchTrainer) with torch $torch_version ($python_version), gloo on CPU"
  echo "- Load: \`uptime\` before: \`$uptime_before\`; load average after: $load_after."
  echo "- Exit status: $status"
  echo
  echo "## Method"
  echo
  echo "One Ray cluster on this machine's loopback: a head with no CPUs and three"
  echo "nodes of 2 CPUs (\`ray start --address\`). Four ranks, two per node, run seed"
  echo "003's TP + PP \`func()\` once per step (seed003_train.py), under"
  echo "\`meshrun --ray --nnodes=2 --nproc-per-node=2 --max-restarts=3\` and under"
  echo "\`TorchTrainer(ScalingConfig(num_workers=4, use_gpu=False),"
  echo "FailureConfig(max_failures=3))\`, seed 003's way. Once every rank has done 3"
  echo "steps, rank 2's node is SIGKILLed (its raylet and all it started); both"
  echo "recover on the surviving node and the spare one, training from step 0 (no"
  echo "checkpoint in either). Columns: bench_ray.py's docstring."
  echo
  echo "## Results"
  echo
  cat "$tmp/stdout"
  bench_logs
} > "$results_dir/results.md"
echo "bench-ray: wrote $results_dir/results.md" >&2
exit "$status"
