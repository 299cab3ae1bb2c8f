#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (the tree and the
# pip wheel), runs every test (unit and integration) with CTest. BUILD_DIR and extra CMake arguments as
# in scripts/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build_dir=${BUILD_DIR:-build}
# The Wheel tests' downloads (torch 2.4.1 and its CUDA libraries, 2.7 GB)
# beside the build, which leaves the network idle, rather than beside the
# other tests, whose slot the download would hold (as root only, as they run).
prefetch=
if [ "${BUILD_WHEEL:-1}" != 0 ] && [ "$(id -u)" -eq 0 ]; then
  mkdir -p "$build_dir"
  # Its own process group (setsid), so that a failed build ends pip too.
  setsid bash tests/e2e/wheel_test.sh --prefetch "$build_dir/wheel-test" \
    "${MESHRUN_VENV:-.venv}" > "$build_dir/wheel-test-prefetch.log" 2>&1 &
  prefetch=$!
  trap 'kill -- -"$prefetch" 2> /dev/null || true' EXIT
fi
bash scripts/build.sh "$@"
# The pip wheel, which the Wheel.* tests install (about a minute after the
# build, whose compiles it reuses through ccache). BUILD_WHEEL=0 skips it
# (CI's sanitizer build, whose tests leave the wheel out).
if [ "${BUILD_WHEEL:-1}" != 0 ]; then bash scripts/build-wheel.sh; fi
if [ -n "$prefetch" ] && ! wait "$prefetch"; then
  echo "test.sh: the Wheel tests' downloads failed (they will try again):" \
    "$(tail -1 "$build_dir/wheel-test-prefetch.log")" >&2
fi
# CTEST_EXCLUDE: a regex of tests to leave out (CI's sanitizer stage).
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-2}" --timeout 600 \
  ${CTEST_EXCLUDE:+-E "$CTEST_EXCLUDE"}
