#!/usr/bin/env bash
# Configures and builds meshrun into build/ (or $BUILD_DIR). Extra arguments go
# to CMake, e.g. -DMESHRUN_SANITIZE=ON. BUILD_TARGETS (space-separated) builds
# only those targets and what they need, e.g. the main job's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
# ccache where installed (scripts/install-deps.sh installs it; MESHRUN_CCACHE=0
# for none): the wheel's build (scripts/build-wheel.sh) then compiles nothing
# this one did. Paths relative to the checkout, so build-wheel/'s compiles
# match build/'s; depend mode, so that a miss costs no second preprocessing.
launcher=()
if [ "${MESHRUN_CCACHE:-1}" != 0 ] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1} \
    CCACHE_DEPEND=${CCACHE_DEPEND:-1}
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
else
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER= -DCMAKE_C_COMPILER_LAUNCHER=)
fi
if ! cmake -S . -B "$build_dir" -G Ninja "${launcher[@]}" "$@" > "$build_dir.configure.log" 2>&1; then
  # Our own configure errors ("meshrun: ...", e.g. no venv) as the one line
  # they are (CMake wraps them); anything else in full.
  ours=$(awk '/^  meshrun/ {on = 1} on && (/^$/ || /^Call Stack/) {exit} on {sub(/^  /, ""); printf "%s ", $0}' \
           "$build_dir.configure.log")
  if [ -n "$ours" ]; then echo "${ours% }" >&2; else cat "$build_dir.configure.log"; fi
  exit 1
fi
# shellcheck disable=SC2086
ninja -C "$build_dir" -j "${JOBS:-$(nproc)}" ${BUILD_TARGETS:-}
