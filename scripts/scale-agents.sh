#!/usr/bin/env bash
# Starts N real `meshrun` agents (one node each, one worker each) against one
# meshrun-rdzvd on loopback, waits for all of them, and prints what became
# of them: how many succeeded, how each of the others ended (exit code or
# signal, and the first line it wrote to stderr), how long the run took
# from the first agent's start to the last agent's exit, and the peak
# threads and descriptors of the agents and of the daemon.
#
#   scripts/scale-agents.sh                      # 1,000 agents, /bin/true workers
#   scripts/scale-agents.sh --agents 2000 --join-timeout 120
#   scripts/scale-agents.sh --daemon-nofile 1024  # the daemon with a 1,024-descriptor limit
#   scripts/scale-agents.sh --agent-nofile 64 --agents 10
#
# Options:
#   --agents N          agents (= --nnodes; default 1000)
#   --join-timeout S    the agents' rdzv join_timeout (default 120)
#   --rdzv-conf K=V,... more of the agents' --rdzv-conf (e.g.
#                       keep_alive_max_attempt=12: a longer lease, so heartbeats
#                       a launch storm delays do not expel nodes)
#   --deadline S        kill what is still running after S seconds (default
#                       join timeout + 60)
#   --daemon-nofile N   run the daemon with RLIMIT_NOFILE N (soft and hard)
#   --agent-hosted      no meshrun-rdzvd: the first agent hosts the daemon on
#                       a free port of 127.0.0.1 (the daemon figures are then
#                       that agent's process)
#   --agent-nofile N    run each agent with RLIMIT_NOFILE N
#   --agent-env K=V     run each agent with K=V in its environment (repeatable;
#                       e.g. LD_PRELOAD= of scripts/lib/more_cpus.c built as a
#                       shared object, which reports 16 CPUs, so gRPC sizes its
#                       thread pools as on a 16-core machine: see that file)
#   --keep DIR          keep the logs in DIR (default: a temporary directory,
#                       removed at the end)
# Environment: BUILD_DIR (default build/; meshrun and meshrun-rdzvd must be
# built). Heavy: N agents are N processes of ~14 threads each (on 2 cores) and
# the run loads the machine for a while; every process it starts is ended by
# pid when it returns. Exit status: 0 when every agent succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
agents=1000 join_timeout=120 deadline="" daemon_nofile="" agent_nofile="" keep=""
agent_env=() rdzv_conf="" hosted=""
while [ $# -gt 0 ]; do
  case "$1" in
    --agents) agents=$2; shift 2 ;;
    --join-timeout) join_timeout=$2; shift 2 ;;
    --rdzv-conf) rdzv_conf=",$2"; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --daemon-nofile) daemon_nofile=$2; shift 2 ;;
    --agent-hosted) hosted=1; shift ;;
    --agent-nofile) agent_nofile=$2; shift 2 ;;
    --agent-env) agent_env+=("$2"); shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    *) echo "scale-agents.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
deadline=${deadline:-$((join_timeout + 60))}
if [ ! -x "$build_dir/bin/meshrun" ] || [ ! -x "$build_dir/bin/meshrun-rdzvd" ]; then
  echo "scale-agents.sh: build meshrun and meshrun-rdzvd in $build_dir first" >&2
  exit 2
fi
meshrun=$(realpath "$build_dir/bin/meshrun")
rdzvd=$(realpath "$build_dir/bin/meshrun-rdzvd")

if [ -n "$keep" ]; then dir=$keep; mkdir -p "$dir"; else dir=$(mktemp -d); fi
daemon_pid="" sampler_pid="" watchdog_pid=""
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "$sampler_pid" "$watchdog_pid"; do
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
  done
  if [ -n "$daemon_pid" ]; then kill -KILL "$daemon_pid" 2>/dev/null || true; fi
  wait 2>/dev/null || true
  [ -n "$keep" ] || rm -rf "$dir"
}
trap cleanup EXIT

# Command prefixes (prlimit and env exec the command: $! stays its pid).
daemon_limit=() agent_limit=()
[ -z "$daemon_nofile" ] || daemon_limit=(prlimit --nofile="$daemon_nofile:$daemon_nofile" --)
[ -z "$agent_nofile" ] || agent_limit=(prlimit --nofile="$agent_nofile:$agent_nofile" --)
[ ${#agent_env[@]} -eq 0 ] || agent_limit=(env "${agent_env[@]}" "${agent_limit[@]}")

if [ -n "$hosted" ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  endpoint=127.0.0.1:$port
else
  "${daemon_limit[@]}" "$rdzvd" --port 0 --log-level warn >"$dir/daemon.out" 2>"$dir/daemon.err" &
  daemon_pid=$!
  echo "$daemon_pid" >"$dir/daemon_pid"
  endpoint=""
  for _ in $(seq 1 100); do  # up to 10 s for the daemon's first line
    endpoint=$(sed -n 's/^MESHRUN_RDZVD_ENDPOINT=//p' "$dir/daemon.out")
    [ -n "$endpoint" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$endpoint" ] || { echo "the daemon did not start:" >&2; cat "$dir/daemon.err" >&2; exit 1; }
fi

# Peak threads and descriptors, sampled every second while the agents run,
# with shell builtins only: a machine out of threads refuses forks too.
mkfifo "$dir/tick"
(
  exec {tick}<>"$dir/tick"
  peak_threads=0 d_threads=0 d_fds=0 agent_pids=() daemon=""
  while :; do
    [ -n "$daemon" ] || { [ -f "$dir/daemon_pid" ] && read -r daemon <"$dir/daemon_pid"; }
    if [ ${#agent_pids[@]} -eq 0 ] && [ -f "$dir/pids" ]; then
      mapfile -t agent_pids <"$dir/pids"
    fi
    t=0
    for p in "${agent_pids[@]}"; do
      { read -r -a stat <"/proc/$p/stat" && t=$((t + stat[19])); } 2>/dev/null
    done
    [ "$t" -gt "$peak_threads" ] && peak_threads=$t
    if [ -n "$daemon" ] && { read -r -a stat <"/proc/$daemon/stat"; } 2>/dev/null; then
      [ "${stat[19]}" -gt "$d_threads" ] && d_threads=${stat[19]}
      fds=("/proc/$daemon/fd/"*)
      [ "${#fds[@]}" -gt "$d_fds" ] && d_fds=${#fds[@]}
    fi
    echo "$peak_threads $d_threads $d_fds" >"$dir/peaks"
    read -r -t 1 -u "$tick" || true
  done
) &
sampler_pid=$!

echo "scale-agents: $agents agents against $endpoint (logs in $dir)"
start=${EPOCHREALTIME/./}
for i in $(seq 0 $((agents - 1))); do
  "${agent_limit[@]}" "$meshrun" --nnodes="$agents" --nproc-per-node=1 \
    --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id=scale \
    --rdzv-conf="join_timeout=$join_timeout$rdzv_conf" --no-python /bin/true \
    >/dev/null 2>"$dir/agent.$i.err" &
  pids+=($!)
  # The first agent hosts the daemon: let it listen before the others look.
  if [ -n "$hosted" ] && [ "$i" -eq 0 ]; then
    echo "$!" >"$dir/daemon_pid"
    for _ in $(seq 1 100); do
      grep -q "hosting the rendezvous daemon" "$dir/agent.0.err" && break
      sleep 0.1
    done
  fi
done
launched=${EPOCHREALTIME/./}

printf '%s\n' "${pids[@]}" >"$dir/pids"

# Wait for every agent, by pid; past the deadline a watchdog kills those left.
(
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  sleep "$deadline" &
  sleeper=$!
  wait "$sleeper"
  touch "$dir/deadline"
  xargs kill -KILL <"$dir/pids" 2>/dev/null
) &
watchdog_pid=$!
# In launch order: bash keeps the status of every child it reaped meanwhile.
declare -A codes
for pid in "${pids[@]}"; do
  if wait "$pid"; then codes[$pid]=0; else codes[$pid]=$?; fi
done
finished=${EPOCHREALTIME/./}
kill "$watchdog_pid" 2>/dev/null || true
[ -f "$dir/deadline" ] && echo "scale-agents: the deadline ($deadline s) passed; the agents left were killed"

ok=0
declare -A outcomes
for i in "${!pids[@]}"; do
  pid=${pids[$i]}
  if [ -z "${codes[$pid]+x}" ]; then
    what="not reaped"
  elif [ "${codes[$pid]}" -eq 0 ]; then
    ok=$((ok + 1)); continue
  else
    code=${codes[$pid]}
    if [ "$code" -gt 128 ]; then what="killed by signal $((code - 128))"; else what="exit $code"; fi
    line=$(grep -m1 -v '^\[' "$dir/agent.$i.err" || true)
    [ -n "$line" ] || line=$(tail -n1 "$dir/agent.$i.err")
    what="$what: ${line:0:320}"
  fi
  outcomes[$what]=$((${outcomes[$what]:-0} + 1))
done
read -r peak_threads d_threads d_fds <"$dir/peaks" || true
seconds() { printf '%d.%02d' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }
echo "scale-agents: $agents agents launched in $(seconds $((launched - start))) s;" \
  "all exited $(seconds $((finished - start))) s after the first start"
echo "scale-agents: $ok of $agents agents succeeded"
for what in "${!outcomes[@]}"; do echo "  ${outcomes[$what]} x $what"; done
echo "scale-agents: peak threads of all agents $peak_threads; daemon peak threads $d_threads, descriptors $d_fds"
if [ -n "$hosted" ]; then
  echo "scale-agents: the daemon was hosted by agent 0 (figures above are its process)"
elif kill -0 "$daemon_pid" 2>/dev/null; then
  echo "scale-agents: the daemon is alive"
else
  wait "$daemon_pid" && code=0 || code=$?
  echo "scale-agents: the daemon died (status $code): $(tail -n1 "$dir/daemon.err")"
fi
[ "$ok" -eq "$agents" ]
