#!/usr/bin/env bash
# Configures and builds meshrun into build/ (or $BUILD_DIR). Extra arguments go
# to CMake, e.g. -DMESHRUN_SANITIZE=ON. BUILD_TARGETS (space-separated) builds
# only those targets and what they need, e.g. the main job's binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
if ! cmake -S . -B "$build_dir" -G Ninja "$@" > "$build_dir.configure.log" 2>&1; then
  # Our own configure errors ("meshrun: ...", e.g. no venv) as the one line
  # they are (CMake wraps them); anything else in full.
  ours=$(awk '/^  meshrun/ {on = 1} on && (/^$/ || /^Call Stack/) {exit} on {sub(/^  /, ""); printf "%s ", $0}' \
           "$build_dir.configure.log")
  if [ -n "$ours" ]; then echo "${ours% }" >&2; else cat "$build_dir.configure.log"; fi
  exit 1
fi
# shellcheck disable=SC2086
ninja -C "$build_dir" -j "${JOBS:-$(nproc)}" ${BUILD_TARGETS:-}
