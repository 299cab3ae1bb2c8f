#!/usr/bin/env bash
# Fault-tolerant replicas across a daemon restart (issue 18): train_example
# --fault-tolerant under a separate meshrun-rdzvd with --state-dir; the daemon
# is SIGKILLed mid-training and started again on its port. The agent
# reconnects, the workers retry their quorum, a vote the old daemon never
# answered is discarded (a replica it did answer heals the others at the next
# step), and the run ends with every rank verified and no worker restarted.
#
#   ft_daemon_restart_test.sh BUILD_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)/bin
work=$(mktemp -d)
daemon_pid="" launcher_pid=""
cleanup() {
  for pid in $launcher_pid $daemon_pid; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "ft_daemon_restart_test: $*"
  echo "--- job:"; cat "$work/job.log" 2>/dev/null
  echo "--- daemon:"; cat "$work/daemon"*.log 2>/dev/null
  exit 1
}
# Waits up to $2 seconds for a line matching $3 in file $1.
wait_for() {
  for _ in $(seq 1 $(($2 * 10))); do
    grep -q "$3" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

"$bin/meshrun-rdzvd" --port 0 --state-dir "$work/state" > "$work/daemon1.log" 2>&1 &
daemon_pid=$!
wait_for "$work/daemon1.log" 30 '^MESHRUN_RDZVD_ENDPOINT=' || fail "the daemon did not start"
endpoint=$(sed -n 's/^MESHRUN_RDZVD_ENDPOINT=//p' "$work/daemon1.log")

"$bin/meshrun" --nnodes=1 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint="$endpoint" \
  --rdzv-id=ft-daemon-restart --restart-scope=replica --max-restarts=3 --no-python \
  "$bin/train_example" --dp 4 --fault-tolerant --steps 600 --verify > "$work/job.log" 2>&1 &
launcher_pid=$!
wait_for "$work/job.log" 120 '^step 150 loss' || fail "training did not reach step 150"
kill -9 "$daemon_pid"
wait "$daemon_pid" 2>/dev/null || true
killed_at=$(grep -c ' loss ' "$work/job.log")
"$bin/meshrun-rdzvd" --host "${endpoint%:*}" --port "${endpoint##*:}" --state-dir "$work/state" \
  > "$work/daemon2.log" 2>&1 &
daemon_pid=$!

# The launcher bounds itself (its lease, the quorum's timeouts); CTest's
# timeout bounds the test.
status=0
wait "$launcher_pid" || status=$?
launcher_pid=""
[ "$status" = 0 ] || fail "meshrun exited $status"
[ "$killed_at" -lt 600 ] || fail "training had finished before the daemon was killed"
grep -q "reconnected to the rendezvous daemon" "$work/job.log" || fail "the agent did not reconnect"
[ "$(grep -c 'equal single-process training of 600 committed steps' "$work/job.log")" = 4 ] ||
  fail "not every rank verified 600 committed steps"
[ "$(grep -c ': replica [0-9] member 0 incarnation' "$work/job.log")" = 4 ] ||
  fail "a worker was restarted"
echo "ft_daemon_restart_test: daemon killed after $killed_at steps; all 4 ranks verified"
