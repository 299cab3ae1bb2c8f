#!/usr/bin/env bash
# The README's main job: a character-level GPT (build/bin/train_text: the
# plain-libtorch GPT of worker_lib/models/gpt.h with AdamW, through the
# worker library's torch::nn::Module API, gloo on CPU) trained on the fortune
# cookies of Debian's `fortunes` package by 4 workers on a dp=2 x tp=2 mesh
# under `meshrun --standalone` (embedded rendezvous daemon, status page).
# Midway one worker SIGKILLs itself; meshrun restarts the world and training
# resumes from the last sharded checkpoint. Then an uninterrupted run of the
# same training checks that the healed run ended with the same final loss
# and parameters, and gnuplot draws the losses with the failure marked.
# Installs and builds first: the launcher and train_text only (every test and
# benchmark is built by scripts/test.sh).
#
# --fault-tolerant shows restart-free recovery instead: the two dp replicas
# (of 2 tp workers each) are fault-tolerant replica groups under
# `meshrun --restart-scope=replica --replica-size=2`; when the worker dies,
# only its replica group restarts and copies the parameters and AdamW's
# state from the live one, which trains on alone meanwhile, keeping its processes. The check is
# then a reference run that replays every committed step with exactly the
# replicas that took part in it (--replay-history), against both replicas'
# final parameters.
#
#   bash scripts/main-job.sh                 # about 1 minute once built
#   bash scripts/main-job.sh --fault-tolerant
#   bash scripts/main-job.sh --no-failure    # no worker is killed
#   bash scripts/main-job.sh --no-verify     # no uninterrupted reference run
#   bash scripts/main-job.sh --steps 60      # extra arguments go to train_text
#
# Environment: RUN_DIR (default runs/main-job-<time>) holds the logs, the
# checkpoints, loss.csv and loss.png; BUILD_DIR (default build); SKIP_SETUP=1
# skips install and build (the CI test runs a short job on its own build).
set -euo pipefail
cd "$(dirname "$0")/.."

failure=1
verify=1
fault_tolerant=0
steps=300
kill_at=-1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-failure) failure=0 ;;
    --no-verify) verify=0 ;;
    --fault-tolerant) fault_tolerant=1 ;;
    --steps) steps=$2; shift ;;
    --steps=*) steps=${1#--steps=} ;;
    *) extra+=("$1") ;;
  esac
  shift
done
if [ "$failure" = 1 ]; then
  # Midway, and not on a checkpoint step, so that the restart redoes steps.
  kill_at=$(( steps / 2 + steps / 20 ))
fi

if [ "${SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/install-deps.sh --main-job
  # Only what the job runs; the test command builds the rest.
  BUILD_TARGETS="meshrun train_text" bash scripts/build.sh
fi
bin=${BUILD_DIR:-build}/bin
run_dir=${RUN_DIR:-runs/main-job-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)
rm -rf "$run_dir/ckpt" "$run_dir/healed" "$run_dir/uninterrupted" "$run_dir/loss.csv"

common=(--steps "$steps" "${extra[@]}")
launch=("$bin/meshrun" --standalone --no-python)
if [ "$fault_tolerant" = 1 ]; then
  recovery=(--restart-scope=replica --replica-size=2 "$bin/train_text" --fault-tolerant)
  how="fault-tolerant replicas: only the failed worker's replica group restarts"
else
  recovery=("$bin/train_text" --checkpoint-dir "$run_dir/ckpt"
            --checkpoint-every $(( steps / 6 > 0 ? steps / 6 : 1 )))
  how="the world restarts from the last checkpoint"
fi

echo "== main job: 4 workers, dp=2 x tp=2, $steps steps; run directory $run_dir"
[ "$failure" = 1 ] && echo "== a worker will be killed before step $(( kill_at + 1 )); $how (--no-failure: no failure)"
started=$(date +%s)
set +e
"${launch[@]}" --nproc-per-node=4 --max-restarts=2 --metrics-port 0 \
  "${recovery[@]}" "${common[@]}" \
  --kill-at-step "$kill_at" --log "$run_dir/loss.csv" --save-final "$run_dir/healed" \
  2>&1 | tee "$run_dir/job.log" |
  grep --line-buffered -v -E '^\[[0-9:.]+\] \[(agent|rdzvd)\]|OMP_NUM_THREADS'
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] || { echo "main job: the training run failed (exit $status; see $run_dir/job.log)"; exit "$status"; }
restarts=$(grep -c "restarting the run" "$run_dir/job.log" || true)
echo "== training took $(( $(date +%s) - started )) s with $restarts restart(s) of the world"
if [ "$fault_tolerant" = 1 ]; then
  # Each worker printed "rank R pid P: ..." once per process it ran in.
  awk '/^rank [0-9]+ pid [0-9]+: replica/ { n[$2]++; p = $4; sub(":", "", p); pid[$2] = pid[$2] " " p }
    END { for (r = 0; r < 4; r++) printf "== rank %d: %s (pid%s)\n", r,
          (n[r] > 1 ? "restarted " (n[r] - 1) " time(s)" : "one process from start to end"), pid[r] }' \
    "$run_dir/job.log"
fi

if [ "$verify" = 1 ]; then
  if [ "$fault_tolerant" = 1 ]; then
    # Every committed step replayed on one replica's worth of workers: each
    # replica that trained it on its rows, their gradients averaged as the
    # replicas' all-reduce does (train_text --replay-history).
    echo "== verifying: the committed steps replayed by one replica group (log: $run_dir/uninterrupted.log)"
    reference=(--nproc-per-node=2 "$bin/train_text" --dp 1 --tp 2
               --replay-history "$run_dir/healed/history")
  else
    echo "== verifying: the same training without a failure (log: $run_dir/uninterrupted.log)"
    reference=(--nproc-per-node=4 "$bin/train_text")
  fi
  set +e
  "${launch[@]}" "${reference[@]}" "${common[@]}" --sample 0 --progress-every 1000000 \
    --save-final "$run_dir/uninterrupted" --compare-with "$run_dir/healed" \
    > "$run_dir/uninterrupted.log" 2>&1
  status=$?
  set -e
  grep -E '^(verified|MISMATCH)' "$run_dir/uninterrupted.log" || true
  [ "$status" = 0 ] || { echo "main job: verification failed (exit $status; see $run_dir/uninterrupted.log)"; exit 1; }
fi

bash scripts/lib/plot-loss.sh "$run_dir/loss.csv" "$run_dir/loss.png"
echo "== loss plot: $run_dir/loss.png; total $(( $(date +%s) - started )) s"
