#!/usr/bin/env bash
# Recovery from a worker failure (issue 18): meshrun's fault-tolerant replicas
# (train_example --fault-tolerant under --restart-scope=replica) against
# meshrun's default full restart from the latest checkpoint and against
# torchrun 2 with a torch.distributed.checkpoint reload
# (bench/recovery/torch_ddp_recovery.py), all world 4 on the same torch::nn GPT
# and batch, in one run; records bench/recovery/results.md. See
# bench/recovery/bench_recovery.py for what is measured and how.
#
#   scripts/bench-recovery.sh                # ~10 minutes on 2 loaded cores
#   scripts/bench-recovery.sh --rounds 1     # a look
#   scripts/bench-recovery.sh --quick        # a smoke run (small model, short runs), ~2 minutes
#
# Extra arguments go to bench_recovery.py (--setups, --experiments, --sizes,
# --steps, --kill-at-step, --checkpoint-every, --every-steps, --kill-every,
# --rounds, --quick, --threads, --timeout, --work). Environment:
#   BUILD_DIR    build directory (default build/; configured if missing)
#   RESULTS_DIR  where results.md goes (default bench/recovery)
#   JOBS         ninja -j (default 2)
#   WAIT_QUIET   seconds to wait for a quiet machine first (default 60)
#   NO_BUILD     1: use BUILD_DIR's binaries as they are (another ninja may be
#                running there), without configuring or building
#   MESHRUN_VENV the virtualenv with the pinned torch (default .venv)
#   TORCHRUN     the peer (default $MESHRUN_VENV/bin/torchrun)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/recovery}
jobs=${JOBS:-2}
wait_quiet=${WAIT_QUIET:-60}

source scripts/lib/bench-common.sh
build_binaries bench-recovery train_example meshrun meshrun-rdzvd
find_torch bench-recovery
torchrun=${TORCHRUN:-$venv_torchrun}
[ -x "$torchrun" ] || { echo "bench-recovery: peer $torchrun not found (set TORCHRUN)" >&2; exit 1; }
# Bad flags say so now, not after waiting for a quiet machine.
"$venv_python" bench/recovery/bench_recovery.py --meshrun "$build_dir/bin/meshrun" \
  --train-example "$build_dir/bin/train_example" --torchrun "$torchrun" "$@" --dry-run > /dev/null
wait_for_quiet bench-recovery "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmd=("$venv_python" bench/recovery/bench_recovery.py
     --meshrun "$build_dir/bin/meshrun" --train-example "$build_dir/bin/train_example"
     --torchrun "$torchrun" --raw "$tmp/raw" "$@")
# The invocation as typed, with the settings that came from the environment.
invocation="scripts/bench-recovery.sh${*:+ $*}"
for var in TORCHRUN MESHRUN_VENV JOBS RESULTS_DIR BUILD_DIR WAIT_QUIET NO_BUILD; do
  [ -n "${!var:-}" ] && invocation="$var=${!var} $invocation"
done
# Where the binaries come from: another tree's build (NO_BUILD=1) may be older
# than that tree's HEAD, so their times are recorded too.
built="$build_dir"
source_tree=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$source_tree" ] && [ "$(cd "$source_tree" && pwd -P)" != "$(pwd -P)" ]; then
  built="$build_dir of $source_tree, whose HEAD is $(TZ=UTC git -C "$source_tree" log -1 --format='%h (committed %cd)' --date=format-local:'%H:%M:%S UTC' 2>/dev/null || echo '?')$(git -C "$source_tree" diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
fi
built="$built; built at $(for binary in train_example meshrun meshrun-rdzvd; do
  TZ=UTC date -r "$build_dir/bin/$binary" "+$binary %H:%M:%S UTC"; done | paste -sd, - | sed 's/,/, /g')"
mark_start
run_driver "${cmd[@]}"
cat "$tmp/stdout"
{
  echo "# Recovery benchmark: meshrun fault-tolerant replicas vs full restart vs torchrun 2 + DCP; meshrun.ft vs torchft"
  echo
  echo "Produced by \`scripts/bench-recovery.sh\` (bench/recovery/bench_recovery.py,"
  echo "train_example, bench/recovery/torch_ddp_recovery.py, ft_python_recovery.py,"
  echo "torchft_launch.py); do not edit by hand."
  echo
  echo "- Command: \`$invocation\`, which ran \`${cmd[*]}\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $tree; binaries: $built"
  echo "- Peer: torchrun of torch $torch_version ($torchrun, $python_version), gloo on CPU"
  echo "- Load: \`uptime\` before: \`$uptime_before\`; load average after: $load_after."
  echo "  The machine is shared with other engineers' builds and tests: absolute times are"
  echo "  inflated and noisy; compare medians and ratios within this run."
  echo "- Exit status: $status"
  echo
  echo "## Method"
  echo
  echo "- Setups, world 4 each (dp 4, one rank a replica), \`--standalone\`, OMP_NUM_THREADS=1:"
  echo "  - meshrun FT replicas: \`meshrun --no-python --restart-scope=replica --max-restarts=K"
  echo "    train_example --model gpt ... --dp 4 --fault-tolerant\`: the survivors discard"
  echo "    the step in progress and go on without the failed replica; only it restarts, and it"
  echo "    copies the state from a live replica at a later step's quorum."
  echo "  - meshrun full restart: \`meshrun --no-python --max-restarts=K train_example ... --dp 4"
  echo "    --checkpoint-dir D --checkpoint-every C\` (meshrun's default scope): every worker"
  echo "    restarts and resumes from the latest sharded checkpoint."
  echo "  - torchrun 2 + DCP: \`torchrun --max-restarts=K torch_ddp_recovery.py --checkpoint-dir D"
  echo "    --checkpoint-every C\`: DDP over the same GPT (its Python twin,"
  echo "    worker_lib/models/gpt.py), dcp.save of model + optimizer state every C steps, dcp.load of the latest on"
  echo "    start; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, without which torch 2.15's restarted"
  echo "    gloo workers read the dead attempt's addresses from the shared store and fail."
  echo "  - meshrun.ft (Python): \`meshrun --restart-scope=replica --max-restarts=K --no-python"
  echo "    python -u ft_python_recovery.py --system meshrun\`: the GPT's Python twin trained"
  echo "    through meshrun.ft's Manager and Optimizer, a replica group per worker; only the"
  echo "    failed group restarts, and it is healed at a later step's quorum."
  echo "  - torchft 0.2.0: \`torchft_launch.py --torchrun ... ft_python_recovery.py --system"
  echo "    torchft\`: torchft_lighthouse with its README's flags (--min_replicas 1"
  echo "    --quorum_tick_ms 100 --join_timeout_ms 10000) and a torchrun --max-restarts=K per"
  echo "    replica group; the same program on torchft's Manager (timeout 20 s, quorum timeout"
  echo "    30 s), DistributedDataParallel and Optimizer; the groups start training together;"
  echo "    the restarted group heals over torchft's HTTP checkpoint transport."
  echo "  - The Python pair runs longer (--python-steps, --python-every-steps,"
  echo "    --python-kill-every), a Python restart taking seconds; the same F."
  echo "- Failures: \`--kill-at-step F\` / \`--kill-every N\`, train_example's flags, the same in"
  echo "  torch_ddp_recovery.py and ft_python_recovery.py: the worker prints \`rank R SIGKILLs"
  echo "  itself at step F (start)\` and SIGKILLs itself at the start of that step (restart-free"
  echo "  setups, --kill-every: at the first step from there that every replica takes part in,"
  echo "  once the failure before has struck)."
  echo "- Every output line is timestamped as the driver reads it from the launcher's pipe;"
  echo "  definitions of step time, steps lost, seconds lost, back to full strength, the"
  echo "  breakdown and efficiency: the docstring of bench/recovery/bench_recovery.py. In short:"
  echo "  seconds lost = t(step F's line after the failure) - t(kill line) - one step;"
  echo "  efficiency = (S - 1) x step time / (t(last step line) - t(first step line))."
  echo
  echo "## Results"
  echo
  cat "$tmp/stdout"
  if [ -f bench/recovery/notes.md ]; then
    echo
    echo "## Notes (bench/recovery/notes.md, written by hand for the run it names)"
    echo
    cat bench/recovery/notes.md
  fi
  bench_logs "each launch's command and numbers"
} > "$results_dir/results.md"
echo "bench-recovery: wrote $results_dir/results.md" >&2
exit "$status"
