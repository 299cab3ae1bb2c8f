#!/usr/bin/env bash
# Installs what meshrun builds, tests and benchmarks with: Debian's packages,
# then the project's Python virtualenv (.venv, or $MESHRUN_VENV) with the
# pinned torch of scripts/python-requirements.txt, the project's one torch
# (its libtorch builds the worker library; its torchrun is the peer).
# Idempotent and quick when everything is present; needs root (or sudo).
# Used by the README and by .ci/run; `--main-job` installs only what the
# build and the main job need.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the build configures with, and the main job's own needs.
packages=(
  build-essential cmake ninja-build pkg-config git
  # The pip wheel's build reuses the tree's compiles through it.
  ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # Gloo's headers: the torch wheel ships ProcessGroupGloo.hpp without the
  # gloo/*.h it includes (it holds Gloo's objects only through pointers).
  libgloo-dev
  python3 python3-venv
  # The main job's text (fortune cookies) and its loss plot.
  fortunes gnuplot-nox
)
# What only the tests need. `--main-job` (scripts/main-job.sh) leaves these
# out: SLURM, Chromium and clang are most of a fresh machine's download.
test_packages=(
  clang-format iproute2 procps
  # The tests' watchdog prints a hung test's stacks with it.
  gdb
  openssl clang libclang-rt-14-dev
  slurmctld slurmd slurm-client munge
  chromium chromium-driver
  # Packaging (Install.* tests): man pages, dpkg-shlibdeps for the package's
  # Depends, systemd-analyze to verify the daemon's unit, curl for /metrics.
  help2man dpkg-dev systemd curl
  # The daemon's state in etcd (EtcdFailoverTest): a three-member cluster.
  etcd-server etcd-client
)
case "${1:-}" in
  --main-job) ;;
  "") packages+=("${test_packages[@]}") ;;
  *) echo "install-deps: unknown argument $1 (--main-job, or none)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The virtualenv, on Debian's python3 (not whichever python3 is first on PATH).
venv=${MESHRUN_VENV:-.venv}
requirements=scripts/python-requirements.txt
[ -x "$venv/bin/python3" ] || /usr/bin/python3 -m venv "$venv"
if bash scripts/check-venv.sh "$venv" > /dev/null 2>&1; then
  echo "install-deps: $venv has $(grep -c '==' "$requirements") pinned Python packages"
else
  echo "install-deps: installing $(grep '==' "$requirements" | tr '\n' ' ')into $venv (about 5.3 GB)"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
  bash scripts/check-venv.sh "$venv"
fi

# The meshrun Python package (python/meshrun, `import meshrun`), built from
# this checkout with its gRPC stubs generated from proto/ (pyproject.toml,
# without the binaries, which the tests take from build/): a few seconds, so
# always, and the venv holds this checkout's.
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --config-settings=cmake.define.MESHRUN_PYTHON_ONLY=ON --config-settings=build-dir=build-python .
echo "install-deps: meshrun $("$venv/bin/python3" -c 'import meshrun; print(meshrun.__version__)') (python/meshrun) installed into $venv"
