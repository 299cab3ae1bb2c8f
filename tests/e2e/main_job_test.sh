#!/usr/bin/env bash
# A short main job (scripts/main-job.sh: the same code path, fewer steps and a
# smaller model) under the real launcher, then its verification and the loss
# plot.
#
#   main_job_test.sh BUILD_DIR                    # a worker is killed, the world
#       restarts and training resumes from a checkpoint; an uninterrupted run
#       verifies the final loss and parameters
#   main_job_test.sh BUILD_DIR --fault-tolerant   # a worker is killed, only its
#       replica group restarts and heals from the live one, whose workers keep
#       their processes; a replay of the committed steps verifies both replicas
set -euo pipefail
build_dir=$(cd "$1" && pwd)
mode=${2:-}
cd "$(dirname "$0")/../.."
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
fail() { echo "main_job_test: $*"; echo "--- job.log:"; cat "$run_dir/job.log" 2>/dev/null; exit 1; }

# The job bounds itself: its own launcher ends every worker, and CTest's
# timeout ends the job.
out=$(SKIP_SETUP=1 BUILD_DIR="$build_dir" RUN_DIR="$run_dir" bash scripts/main-job.sh \
        --steps 24 --layers 1 --d-model 64 --seq 32 --batch 16 --eval-every 8 \
        --sample 40 $mode 2>&1) || fail "the job failed: $out"
echo "$out"

grep -q "status page and metrics on http://" <<< "$out" || fail "no status page URL printed"
grep -q "kills itself (SIGKILL) before step" <<< "$out" || fail "no worker was killed"
grep -q "^verified: final train loss" <<< "$out" || fail "no verification line"
grep -q "^sampled text" <<< "$out" || fail "no sample"
[ "$(head -c 8 "$run_dir/loss.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  fail "loss.png is not a PNG"

if [ "$mode" = --fault-tolerant ]; then
  ! grep -q "restarting the run" "$run_dir/job.log" || fail "meshrun restarted the world"
  grep -q "^replica 1 member [01] (rank [23]) healed" <<< "$out" ||
    fail "the killed worker's replica did not heal from the live one"
  grep -q "^== rank 0: one process from start to end" <<< "$out" &&
    grep -q "^== rank 1: one process from start to end" <<< "$out" ||
    fail "a worker of the live replica was restarted"
  grep -q "^== rank 3: restarted 1 time" <<< "$out" || fail "the killed worker did not restart"
  # Rank 0 logged every step once, some trained by one replica only (the
  # restarted one may be back only at the end: the live one waits for it
  # and heals it before leaving), and the loss fell.
  awk -F, 'NR == 2 { first = $3 } NR > 1 { last = $3; rows++; if ($6 == 1) alone++ }
    END { if (rows != 24 || alone < 1 || !(last < first)) exit 1 }' "$run_dir/loss.csv" ||
    fail "loss.csv: expected 24 steps, some by one replica, a falling loss: $(cat "$run_dir/loss.csv")"
  echo "main_job_test: replica restart, heal, survivors' pids, verification and plot all seen"
else
  grep -q "restarting the run" "$run_dir/job.log" || fail "meshrun did not restart the world"
  grep -q "^resumed from the checkpoint after step" <<< "$out" || fail "training did not resume"
  # Both attempts logged, and the loss fell from the first step to the last.
  awk -F, 'NR == 2 { first = $3 } NR > 1 { last = $3; attempts[$1] = 1 }
    END { if (length(attempts) != 2 || !(last < first)) exit 1 }' "$run_dir/loss.csv" ||
    fail "loss.csv: expected two attempts and a falling loss: $(cat "$run_dir/loss.csv")"
  echo "main_job_test: restart, resume, verification and plot all seen"
fi
