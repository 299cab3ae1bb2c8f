#!/usr/bin/env bash
# Configures and builds meshrun into build/ (or $BUILD_DIR). Extra arguments go
# to CMake, e.g. -DMESHRUN_SANITIZE=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja "$@" > "$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
ninja -C "$build_dir" -j "${JOBS:-$(nproc)}"
