#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (the tree and the
# pip wheel), runs every test (unit and integration) with CTest. BUILD_DIR and extra CMake arguments as
# in scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh "$@"
# The pip wheel, which the Wheel.* tests install (about a minute after the
# build, whose compiles it reuses through ccache). BUILD_WHEEL=0 skips it
# (CI's sanitizer build, whose tests leave the wheel out).
if [ "${BUILD_WHEEL:-1}" != 0 ]; then bash scripts/build-wheel.sh; fi
build_dir=${BUILD_DIR:-build}
# CTEST_EXCLUDE: a regex of tests to leave out (CI's sanitizer stage).
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" --timeout 600 \
  ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"}
