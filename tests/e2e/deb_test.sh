#!/usr/bin/env bash
# The Debian package of the launcher side (issue 20): cpack builds it, its
# metadata and unit are checked (systemd-analyze verify), it is installed with
# dpkg into a clean root, and a two-agent job runs there on the installed
# binaries with the daemon started as its systemd unit starts it.
#
#   deb_test.sh BUILD_DIR
#
# The clean root (tests/e2e/clean_root.py) is Debian's Essential packages plus
# the package's Depends closure, copied from this machine's installed Debian 12
# packages, with a dpkg database listing exactly those; dpkg checks the
# package's dependencies against it, and a library missing from Depends makes
# the binaries fail to load in the chroot. We chose it over a debootstrap
# chroot: that needs a mirror and minutes per run, this needs neither (about
# 20 s) and tests the same two things. Needs root (chroot, mknod); exit 77
# (skipped) otherwise.
set -euo pipefail
build_dir=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then echo "deb_test: skipped: needs root (chroot, mknod)"; exit 77; fi
for tool in cpack dpkg-deb systemd-analyze chroot python3; do
  command -v "$tool" > /dev/null ||
    { echo "deb_test: skipped: $tool not found (scripts/install-deps.sh)"; exit 77; }
done
work=$(mktemp -d)
root=$work/root
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2> /dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "deb_test: $*"
  for log in "$work"/*.log; do echo "--- $log:"; tail -n 30 "$log"; done
  exit 1
}
start=$(date +%s)

# --- Build and inspect the package ------------------------------------------------
(cd "$build_dir" && cpack -G DEB -B "$work/pkg") > "$work/cpack.log" 2>&1 ||
  fail "cpack failed"
debs=("$work"/pkg/meshrun_*.deb)
if [ ${#debs[@]} -ne 1 ] || [ ! -f "${debs[0]}" ]; then
  fail "expected one meshrun_*.deb: ${debs[*]}"
fi
deb=${debs[0]}
depends=$(dpkg-deb -f "$deb" Depends)
echo "deb_test: $(basename "$deb"), Depends: $depends"
for lib in libc6 libstdc++6 libgrpc++1.51 libprotobuf32; do
  grep -qF "$lib " <<< "$depends" || fail "Depends lacks $lib"
done
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/meshrun ./usr/bin/meshrun-rdzvd ./usr/bin/meshrun-slurm \
         ./usr/lib/systemd/system/meshrun-rdzvd.service ./etc/default/meshrun-rdzvd \
         ./usr/share/man/man1/meshrun.1.gz ./usr/share/man/man1/meshrun-rdzvd.1.gz \
         ./usr/share/man/man1/meshrun-slurm.1.gz; do
  grep -qx -- "$f" <<< "$contents" || fail "the package lacks $f"
done
! grep -q "include/\|\.a$\|cmake/" <<< "$contents" || fail "development files in the package"
dpkg-deb -I "$deb" conffiles | grep -qx /etc/default/meshrun-rdzvd ||
  fail "/etc/default/meshrun-rdzvd is not a conffile"

# --- A clean root, and the package installed into it with dpkg ---------------------
mapfile -t packages < <(sed 's/([^)]*)//g; s/|[^,]*//g; s/,/\n/g' <<< "$depends" | tr -d ' ')
# systemd too, as on a fresh Debian 12: the unit is verified against its units.
python3 "$src/tests/e2e/clean_root.py" "$root" "${packages[@]}" systemd > "$work/root.log" ||
  fail "making the clean root failed"
dpkg --root="$root" -i "$deb" > "$work/dpkg.log" 2>&1 || fail "dpkg -i in the clean root failed"
chroot "$root" /sbin/ldconfig  # libc-bin's trigger, as on a real installation
unit=$root/usr/lib/systemd/system/meshrun-rdzvd.service
# --man=no: it would look for the man page on this machine; the package's is checked above.
systemd-analyze verify --man=no --root="$root" /usr/lib/systemd/system/meshrun-rdzvd.service \
  > "$work/verify.log" 2>&1 || fail "systemd-analyze verify failed"
installed=$(date +%s)

# --- The installed binaries ------------------------------------------------------------
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin "$@"; }
version=$(in_root meshrun --version)
[[ $version =~ ^meshrun\ [0-9.]+\ \(commit\ ([0-9a-f]{12}(-dirty)?|unknown)\)$ ]] ||
  fail "meshrun --version printed '$version'"
[ "$(in_root meshrun-rdzvd --version)" = "meshrun-rdzvd ${version#meshrun }" ] ||
  fail "meshrun-rdzvd --version: $(in_root meshrun-rdzvd --version)"
[ "$(in_root meshrun-slurm --version)" = "$version" ] || fail "meshrun-slurm --version"
if git -C "$src" rev-parse --short=12 HEAD > /dev/null 2>&1; then
  head=$(git -C "$src" rev-parse --short=12 HEAD)
  [[ $version == *"(commit $head"* ]] || fail "built from $head, but --version says '$version'"
fi

# The daemon, as its unit starts it: the unit's ExecStart with systemd's
# variables ($STATE_DIRECTORY, $CREDENTIALS_DIRECTORY with a private copy of
# the root-only token) and the settings file's, here a kernel-assigned port.
mkdir -p "$root/etc/meshrun" "$root/var/lib/meshrun" "$root/run/credentials/meshrun-rdzvd.service"
(umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$root/etc/meshrun/token")
install -m 0400 "$root/etc/meshrun/token" "$root/run/credentials/meshrun-rdzvd.service/token"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
# systemd's ${VAR} is one word, $VAR is split on whitespace, as in sh.
exec_start=$(sed 's/\${\([A-Z_]*\)}/"${\1}"/g' <<< "$exec_start")
: > "$work/rdzvd.out"  # before the daemon's shell opens it: read below at once
STATE_DIRECTORY=/var/lib/meshrun CREDENTIALS_DIRECTORY=/run/credentials/meshrun-rdzvd.service \
  MESHRUN_RDZVD_HOST=127.0.0.1 MESHRUN_RDZVD_PORT=0 MESHRUN_RDZVD_OPTS="--metrics-port 0" \
  chroot "$root" /bin/sh -c "exec $exec_start" > "$work/rdzvd.out" 2> "$work/rdzvd.log" &
daemon=$!
pids+=("$daemon")
endpoint="" metrics=""
for _ in $(seq 100); do  # up to 10 s
  endpoint=$(sed -n 's/^MESHRUN_RDZVD_ENDPOINT=//p' "$work/rdzvd.out")
  metrics=$(sed -n 's/^MESHRUN_RDZVD_METRICS=//p' "$work/rdzvd.out")
  [ -n "$endpoint" ] && [ -n "$metrics" ] && break
  kill -0 "$daemon" 2> /dev/null || fail "the daemon exited"
  sleep 0.1
done
if [ -z "$endpoint" ] || [ -z "$metrics" ]; then fail "the daemon printed no endpoint within 10 s"; fi

# Two agents (two "nodes"), one worker each, a worker script with no Python.
mkdir -p "$root/opt"
cat > "$root/opt/worker.sh" <<'WORKER'
#!/bin/sh
echo "worker: rank $RANK of $WORLD_SIZE, group rank $GROUP_RANK"
WORKER
chmod +x "$root/opt/worker.sh"
agents=()
for node in 0 1; do
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin MESHRUN_CGROUPS=off \
    meshrun --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id=deb-test --nnodes=2 \
    --nproc-per-node=1 --max-restarts=0 --token-file=/etc/meshrun/token /opt/worker.sh \
    > "$work/agent$node.log" 2>&1 &
  agents+=($!)
  pids+=($!)
done
for node in 0 1; do
  code=0
  for _ in $(seq 600); do  # up to 60 s
    kill -0 "${agents[$node]}" 2> /dev/null || break
    sleep 0.1
  done
  kill -0 "${agents[$node]}" 2> /dev/null && fail "agent $node still running after 60 s"
  wait "${agents[$node]}" || code=$?
  [ "$code" -eq 0 ] || fail "agent $node exited $code"
done
grep -q "^worker: rank 0 of 2" "$work"/agent*.log || fail "no rank 0 worker ran"
grep -q "^worker: rank 1 of 2" "$work"/agent*.log || fail "no rank 1 worker ran"

# The daemon's build on /metrics and the status API.
commit=${version##*(commit }
commit=${commit%)}
curl -sf "http://$metrics/metrics" > "$work/metrics.txt" || fail "GET /metrics failed"
grep -qxF "meshrun_build_info{version=\"$(cut -d' ' -f2 <<< "$version")\",commit=\"$commit\"} 1" \
  "$work/metrics.txt" || fail "/metrics lacks meshrun_build_info of $version"
grep -q '^meshrun_joins_total 2$' "$work/metrics.txt" || fail "/metrics: not 2 joins"
curl -sf "http://$metrics/api/status" | grep -qF "\"commit\":\"$commit\"" ||
  fail "/api/status lacks the commit"

# The graceful stop (the unit's KillSignal): exit 0, the state log flushed.
kill -TERM "$daemon"
code=0
wait "$daemon" || code=$?
pids=()
[ "$code" -eq 0 ] || fail "the daemon exited $code on SIGTERM"
grep -q "state log: [1-9][0-9]* records" "$work/rdzvd.log" || fail "the state log was not flushed"
echo "deb_test: package, clean root and install in $((installed - start)) s; two-agent job on the installed binaries in $(($(date +%s) - installed)) s"
