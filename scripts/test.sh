#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test
# (unit and integration) with CTest. BUILD_DIR and extra CMake arguments as
# in scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh "$@"
build_dir=${BUILD_DIR:-build}
# CTEST_EXCLUDE: a regex of tests to leave out (CI's sanitizer stage).
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" --timeout 600 \
  ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"}
