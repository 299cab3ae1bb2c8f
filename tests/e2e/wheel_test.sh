#!/usr/bin/env bash
# The pip wheel (issue 46) where PyTorch users are, not where it was built:
# installed with pip into a virtualenv of a clean Debian root that has
# Python and nothing of the build (no compiler, no -dev package, no gRPC or
# protobuf of Debian's), it runs PyTorch programs as torchrun would.
#
#   wheel_test.sh WHEEL_DIR CACHE_DIR HOST_VENV clean-root|older-torch
#   wheel_test.sh --prefetch CACHE_DIR HOST_VENV
#
# WHEEL_DIR holds the one wheel scripts/build-wheel.sh made; CACHE_DIR keeps
# the wheels pip downloads for the root (its dependencies, and torch 2.4.1
# with its CUDA libraries for older-torch: about 3.3 GB, once); HOST_VENV is
# the project's venv, whose pinned torch the clean root's venv sees read-only
# (a .pth file after the venv's own site-packages, so the wheel's grpcio and
# protobuf come first) instead of a second 5 GB copy.
#
# clean-root:  pip installs the wheel and its two dependencies, nothing else,
#   and for an older glibc than its tag's would refuse it; --version of the three
#   commands names this checkout's commit; ldd finds
#   glibc alone; a program without torch runs, and a torch script in a venv
#   without torch fails saying which Python ran it; with torch: DDP
#   standalone, DDP on two "nodes" through the wheel's meshrun-rdzvd with a
#   token, and seed 002's meshrun.ft program under --restart-scope=replica.
# older-torch: the wheel beside torch 2.4.1 in its own venv: the workers'
#   environment has every variable 2.4.1's torchrun sets, with the same
#   ranks, and examples/ddp_train.py prints the same losses under both.
#
# The root is tests/e2e/clean_root.py's (Debian's Essential packages and the
# closure of python3-venv and libstdc++6, from this machine's packages), as
# in deb_test.sh.
# Needs root (chroot, mounts); exit 77 (skipped) otherwise.
#
# --prefetch only downloads into CACHE_DIR what the cases would: most of
# older-torch's time on a fresh machine is its 2.7 GB download, which
# scripts/test.sh runs beside the build (network against compiler), not
# beside the other tests.
set -euo pipefail
pinned() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$(dirname "$0")/../../scripts/python-requirements.txt"; }
download_deps() {  # CACHE_DIR HOST_VENV
  "$2/bin/pip" download -q --only-binary=:all: --dest "$1/deps" \
    "grpcio==$(pinned grpcio)" "protobuf==$(pinned protobuf)"
}
download_torch_2_4() {  # CACHE_DIR HOST_VENV
  "$2/bin/pip" download -q --only-binary=:all: --dest "$1/torch-2.4.1" torch==2.4.1
}
if [ "${1:-}" = --prefetch ] && [ $# -eq 3 ]; then
  mkdir -p "$2"
  download_deps "$2" "$3" && download_torch_2_4 "$2" "$3"
  exit
fi
if [ $# -ne 4 ]; then
  echo "usage: wheel_test.sh WHEEL_DIR CACHE_DIR HOST_VENV clean-root|older-torch" >&2
  echo "       wheel_test.sh --prefetch CACHE_DIR HOST_VENV" >&2
  exit 2
fi
wheel_dir=$(cd "$1" 2> /dev/null && pwd) || { echo "wheel_test: no folder $1"; exit 1; }
mkdir -p "$2"
cache=$(cd "$2" && pwd)
host_venv=$(cd "$3" && pwd)
case_name=$4
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then echo "wheel_test: skipped: needs root (chroot, mounts)"; exit 77; fi
# Its own mount namespace: the root's mounts vanish with the test's
# processes, whatever way it ends.
if [ -z "${WHEEL_TEST_NAMESPACE:-}" ]; then
  WHEEL_TEST_NAMESPACE=1 exec unshare --mount --propagation private bash "$0" "$@"
fi

wheels=("$wheel_dir"/meshrun-*-py3-none-manylinux_*_x86_64.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
  echo "wheel_test: expected one meshrun manylinux wheel in $wheel_dir (scripts/build-wheel.sh," \
    "which scripts/test.sh runs), found: ${wheels[*]}"
  exit 1
fi
wheel=${wheels[0]}
work=$(mktemp -d)
root=$work/root
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2> /dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2> /dev/null || true; done
  for mount in proc dev/shm host-site torch-2.4.1; do umount -l "$root/$mount" 2> /dev/null || true; done
  if [ -n "${WHEEL_TEST_KEEP:-}" ]; then echo "wheel_test: kept $work"; else rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT
fail() {
  echo "wheel_test: $*"
  for log in "$work"/*.log; do [ -f "$log" ] && { echo "--- $log:"; tail -n 30 "$log"; }; done
  exit 1
}
start=$(date +%s)

# --- The clean root ----------------------------------------------------------
# libstdc++6 too: the manylinux policy counts it as the system's, and the
# C++ in grpcio's and torch's wheels loads it (Debian's python3 does not).
python3 "$src/tests/e2e/clean_root.py" "$root" python3-venv libstdc++6 > "$work/root.log" ||
  fail "making the clean root failed"
for forbidden in g++ gcc cc protoc; do
  [ ! -e "$root/usr/bin/$forbidden" ] || fail "the clean root has /usr/bin/$forbidden"
done
if compgen -G "$root/usr/lib/x86_64-linux-gnu/libgrpc*" > /dev/null ||
   compgen -G "$root/usr/lib/x86_64-linux-gnu/libprotobuf*" > /dev/null; then
  fail "the clean root has Debian's gRPC or protobuf"
fi
mkdir -p "$root/proc" "$root/host-site" "$root/opt" "$root/wheels" "$root/tmp"
chmod 1777 "$root/tmp"
mount -t proc proc "$root/proc"
mount -t tmpfs tmpfs "$root/dev/shm"
host_site=$("$host_venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mount --bind -o ro "$host_site" "$root/host-site"
cp "$wheel" "$root/wheels/"
cp "$src/examples/ddp_train.py" "$src/tests/e2e/dump_env.py" "$root/opt/"
cp "$src/examples/seeds/002_ddp_elastic/train_script_ft.py" "$root/opt/"

# The wheel's dependencies (the project's pins, which its ranges must
# allow), fetched here: the root installs with --no-index.
download_deps "$cache" "$host_venv" > "$work/download.log" 2>&1 ||
  fail "pip download of the wheel's dependencies failed"
cp "$cache"/deps/*.whl "$root/wheels/"

# A command in the root, as a user with a fresh login would run it: no
# venv activated, only the system's PATH.
# An array, so that a command started in the background is that process
# itself (its pid is the program's, for kill), not a subshell's.
in_root_command=(chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8)
in_root() { "${in_root_command[@]}" "$@"; }
make_venv() {  # VENV [pip install arguments...]
  local venv=$1
  shift
  in_root python3 -m venv "$venv" > "$work/venv.log" 2>&1 || fail "python3 -m venv $venv failed"
  # --no-compile: byte-compiling torch's thousands of files is a minute of
  # CPU that tests nothing here.
  in_root "$venv/bin/pip" install -q --disable-pip-version-check --no-index --no-compile \
    --find-links /wheels "$@" > "$work/pip.log" 2>&1 || fail "pip install in $venv failed"
}
installed=0

# Runs a launcher command in the root with a deadline; its output goes to
# $work/NAME.log. Returns the command's exit code.
run_in_root() {  # NAME SECONDS COMMAND...
  local name=$1 seconds=$2 code=0
  shift 2
  in_root timeout -k 5 "$seconds" "$@" > "$work/$name.log" 2>&1 || code=$?
  return $code
}

clean_root_case() {
  make_venv /venv "/wheels/$(basename "$wheel")"
  installed=$(date +%s)
  # What pip installed: the wheel, its two dependencies and grpcio's own
  # (typing_extensions), nothing else (pip and setuptools are the venv's).
  in_root /venv/bin/pip list --format=freeze --disable-pip-version-check \
    > "$work/freeze.log" 2>&1 || fail "pip list failed"
  extra=$(grep -v -i -E '^(meshrun|grpcio|protobuf|typing_extensions|pip|setuptools)==' \
    "$work/freeze.log" || true)
  [ -z "$extra" ] || fail "pip installed more than meshrun, grpcio and protobuf: $extra"

  # Its tag is right: pip for a glibc older than the tag's refuses it in its
  # own words (asked here with --platform), and takes it for the tag's own.
  glibc_minor=$(sed -n 's/.*-manylinux_2_\([0-9]*\)_x86_64\.whl$/\1/p' <<< "$wheel")
  for platform in "manylinux_2_$((glibc_minor - 1))_x86_64 refused" \
                  "manylinux_2_${glibc_minor}_x86_64 accepted"; do
    read -r tag expected <<< "$platform"
    code=0
    in_root /venv/bin/pip install --dry-run --no-deps --only-binary=:all: --platform "$tag" \
      --target /tmp/platform-check "/wheels/$(basename "$wheel")" > "$work/platform.log" 2>&1 ||
      code=$?
    if [ "$expected" = refused ]; then
      [ "$code" -ne 0 ] && grep -q "is not a supported wheel on this platform" "$work/platform.log" ||
        fail "pip for $tag did not refuse the wheel"
    else
      [ "$code" -eq 0 ] || fail "pip for $tag refused the wheel"
    fi
  done

  # --version names this checkout's commit, the same for all three.
  version=$(in_root /venv/bin/meshrun --version)
  [[ $version =~ ^meshrun\ [0-9.]+\ \(commit\ [0-9a-f]{12}(-dirty)?\)$ ]] ||
    fail "meshrun --version printed '$version'"
  [ "$(in_root /venv/bin/meshrun-rdzvd --version)" = "meshrun-rdzvd ${version#meshrun }" ] ||
    fail "meshrun-rdzvd --version: $(in_root /venv/bin/meshrun-rdzvd --version)"
  [ "$(in_root /venv/bin/meshrun-slurm --version)" = "$version" ] ||
    fail "meshrun-slurm --version: $(in_root /venv/bin/meshrun-slurm --version)"
  if head=$(git -C "$src" rev-parse --short=12 HEAD 2> /dev/null); then
    [[ $version == *"(commit $head"* ]] ||
      fail "this checkout is $head, but the wheel's meshrun says '$version': rebuild it"
  fi

  # ldd: glibc (libc, libm, the loader) and nothing else.
  for binary in meshrun meshrun-rdzvd; do
    in_root ldd "/venv/bin/$binary" > "$work/ldd.log" 2>&1 || fail "ldd $binary failed"
    ! grep -q "not found" "$work/ldd.log" || fail "ldd $binary: a library is missing"
    others=$(grep -v -E '^\s*(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|/lib64/ld-linux-x86-64\.so\.2)( |$)' \
      "$work/ldd.log" || true)
    [ -z "$others" ] || fail "ldd $binary: needs more than glibc: $others"
  done

  # No torch in this venv yet: a program without torch runs, with the venv's
  # own python3 although the venv is not on PATH.
  cat > "$root/opt/hello.py" <<'PY'
import os
import sys

print(f"hello from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} in {sys.prefix}")
PY
  run_in_root hello 60 /venv/bin/meshrun --standalone --nproc-per-node=2 /opt/hello.py ||
    fail "a program without torch failed"
  for rank in 0 1; do
    grep -q "hello from rank $rank of 2 in /venv$" "$work/hello.log" ||
      fail "rank $rank did not run under /venv's python3"
  done
  # A torch script where the venv has no torch: one line names the Python.
  code=0
  run_in_root notorch 60 /venv/bin/meshrun --standalone --nproc-per-node=1 /opt/ddp_train.py ||
    code=$?
  [ "$code" -ne 0 ] || fail "ddp_train.py succeeded without torch"
  grep -q "No module named 'torch'" "$work/notorch.log" || fail "no ImportError for torch"
  grep -qF "meshrun: the workers' Python was /venv/bin/python3 (from meshrun's virtualenv;" \
    "$work/notorch.log" || fail "meshrun did not say which Python ran the workers"

  # The user's torch: the project's pinned one, after the venv's own packages.
  site=$(in_root /venv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo /host-site > "$root$site/zz_host_torch.pth"
  in_root /venv/bin/python3 -c '
import google.protobuf, grpc, meshrun, torch
for module, where in ((meshrun, "/venv/"), (grpc, "/venv/"), (google.protobuf, "/venv/"),
                      (torch, "/host-site/")):
    assert module.__file__.startswith(where), (module.__name__, module.__file__)
' > "$work/imports.log" 2>&1 || fail "the venv does not import its own meshrun, grpc, protobuf"

  # DDP, standalone.
  run_in_root ddp 180 /venv/bin/meshrun --standalone --nproc-per-node=2 /opt/ddp_train.py \
    --epochs 2 || fail "DDP standalone failed"
  grep -q "^world_size=2 " "$work/ddp.log" && grep -q "^epoch 1 loss " "$work/ddp.log" ||
    fail "DDP standalone did not train 2 epochs at world 2"

  # DDP on two "nodes": the wheel's daemon, a token, an agent per node.
  mkdir -p "$root/etc/meshrun"
  (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$root/etc/meshrun/token")
  : > "$work/rdzvd.out"
  "${in_root_command[@]}" /venv/bin/meshrun-rdzvd --host 127.0.0.1 --port 0 --token-file /etc/meshrun/token \
    > "$work/rdzvd.out" 2> "$work/rdzvd.log" &
  daemon=$!
  pids+=("$daemon")
  endpoint=""
  for _ in $(seq 100); do  # up to 10 s
    endpoint=$(sed -n 's/^MESHRUN_RDZVD_ENDPOINT=//p' "$work/rdzvd.out")
    [ -n "$endpoint" ] && break
    kill -0 "$daemon" 2> /dev/null || fail "meshrun-rdzvd exited"
    sleep 0.1
  done
  [ -n "$endpoint" ] || fail "meshrun-rdzvd printed no endpoint within 10 s"
  agents=()
  for node in 0 1; do
    "${in_root_command[@]}" timeout -k 5 180 /venv/bin/meshrun --nnodes=2 --nproc-per-node=1 \
      --rdzv-backend=c10d --rdzv-endpoint="$endpoint" --rdzv-id=wheel-test \
      --token-file=/etc/meshrun/token --max-restarts=0 /opt/ddp_train.py --epochs 2 \
      > "$work/node$node.log" 2>&1 &
    agents+=($!)
    pids+=($!)
  done
  for node in 0 1; do
    code=0
    wait "${agents[$node]}" || code=$?
    [ "$code" -eq 0 ] || fail "the agent of node $node exited $code"
  done
  grep -q "^world_size=2 " "$work"/node*.log && grep -q "^epoch 1 loss " "$work"/node*.log ||
    fail "the two-node run did not train 2 epochs at world 2"
  kill -TERM "$daemon"
  code=0
  wait "$daemon" || code=$?
  [ "$code" -eq 0 ] || fail "meshrun-rdzvd exited $code on SIGTERM"

  # meshrun.ft from the wheel (its gRPC stubs, the wheel's grpcio and
  # protobuf): seed 002's program, two replicas of one worker.
  run_in_root ft 180 /venv/bin/meshrun --standalone --nproc-per-node=2 \
    --restart-scope=replica --replica-size=1 /opt/train_script_ft.py --batch_size 8 \
    --max-epochs 2 || fail "the meshrun.ft program failed"
  # Each replica is a world of one (its rank 0), so two lines an epoch.
  [ "$(grep -c "^rank 0 epoch 1 loss" "$work/ft.log")" -eq 2 ] ||
    fail "ft: the two replicas did not both finish epoch 1"
}

older_torch_case() {
  download_torch_2_4 "$cache" "$host_venv" > "$work/download.log" 2>&1 ||
    fail "pip download of torch 2.4.1 failed"
  mkdir -p "$root/torch-2.4.1"
  mount --bind -o ro "$cache/torch-2.4.1" "$root/torch-2.4.1"
  make_venv /venv24 --find-links /torch-2.4.1 torch==2.4.1 "/wheels/$(basename "$wheel")"
  installed=$(date +%s)
  torch_version=$(in_root /venv24/bin/python3 -c 'import torch; print(torch.__version__)' \
    2> "$work/torch-version.log") || fail "import torch failed in /venv24"
  [[ $torch_version == 2.4.1* ]] || fail "the venv's torch is $torch_version, not 2.4.1"

  # The workers' environment: every variable torch 2.4.1's torchrun sets,
  # with the same ranks and sizes.
  mkdir -p "$root/tmp/env"
  for launcher in torchrun meshrun; do
    run_in_root "$launcher-env" 120 "/venv24/bin/$launcher" --standalone --nproc-per-node=2 \
      /opt/dump_env.py /tmp/env "$launcher" || fail "$launcher: dump_env.py failed"
  done
  python3 - "$root/tmp/env" > "$work/env-compare.log" 2>&1 <<'PY' || fail "the environments differ"
import sys

# The values that must agree. Others differ by nature (ports, run ids,
# files of each run), and MASTER_ADDR by design: meshrun's is the store
# it serves on 127.0.0.1, torchrun's the host's name (docs/launcher.md).
SAME = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS"]


def env(tag, rank):
    with open(f"{sys.argv[1]}/{tag}.{rank}.env") as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f)


for rank in (0, 1):
    torchrun, meshrun = env("torchrun", rank), env("meshrun", rank)
    missing = sorted(set(torchrun) - set(meshrun))
    assert not missing, f"rank {rank}: torchrun 2.4.1 sets {missing}, meshrun does not"
    for key in SAME:
        assert torchrun.get(key) == meshrun.get(key), (rank, key, torchrun.get(key), meshrun.get(key))
print("the same variables, and the same ranks and sizes, on both ranks")
PY

  # examples/ddp_train.py on 2.4.1: the same losses under both launchers.
  for launcher in torchrun meshrun; do
    run_in_root "$launcher-ddp" 180 "/venv24/bin/$launcher" --standalone --nproc-per-node=2 \
      /opt/ddp_train.py --epochs 2 || fail "$launcher: ddp_train.py failed on torch 2.4.1"
    grep '^epoch ' "$work/$launcher-ddp.log" > "$work/$launcher-losses.txt" || true
  done
  [ "$(wc -l < "$work/meshrun-losses.txt")" -eq 2 ] || fail "meshrun: not 2 epochs of losses"
  diff "$work/torchrun-losses.txt" "$work/meshrun-losses.txt" > /dev/null ||
    fail "the losses differ: torchrun $(tr '\n' ' ' < "$work/torchrun-losses.txt")," \
      "meshrun $(tr '\n' ' ' < "$work/meshrun-losses.txt")"
}

case $case_name in
  clean-root) clean_root_case ;;
  older-torch) older_torch_case ;;
  *) echo "wheel_test: unknown case $case_name (clean-root, older-torch)" >&2; exit 2 ;;
esac
echo "wheel_test: $case_name: $(basename "$wheel"): root and install in $((installed - start)) s, runs in $(($(date +%s) - installed)) s"
