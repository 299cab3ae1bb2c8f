#!/usr/bin/env bash
# Builds meshrun's libFuzzer targets with Debian's clang (ASan+UBSan) in their
# own build directory ($FUZZ_BUILD_DIR, default build-fuzz/) and runs each for
# a bounded time:
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
# Each target first replays tests/fuzz/regressions/<target>/ (inputs that once
# crashed it), then fuzzes from tests/fuzz/corpus/<target>/ plus the corpus it
# grew in earlier runs. A crash stops the script with libFuzzer's report; the
# input is left as <build dir>/crash-<target>-*.
set -euo pipefail
seconds=${1:-60}
case "$seconds" in '' | *[!0-9]*)
  echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(request_bytes_fuzzer request_sequence_fuzzer tcpstore_bytes_fuzzer)

# A build configured for fuzzing already (CI's sanitizer build, which builds
# the tests with the same clang, ASan+UBSan and coverage flags) is reused:
# only the fuzz targets are built there, and nothing is compiled twice.
if ! grep -q '^MESHRUN_BUILD_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHRUN_BUILD_FUZZ=ON -DMESHRUN_SANITIZE=ON \
    -DMESHRUN_BUILD_TESTS=OFF -DMESHRUN_BUILD_BENCH=OFF -DMESHRUN_BUILD_WORKER_LIB=OFF >/dev/null
fi
ninja -C "$build" -j2 "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for target in "${targets[@]}"; do
  echo "=== $target: ${seconds} s ==="
  regressions=$root/tests/fuzz/regressions/$target
  if compgen -G "$regressions/*" >/dev/null; then
    "$build/bin/$target" "$regressions"/*
  fi
  grown=$build/corpus/$target
  mkdir -p "$grown"
  seeds=()
  [ -d "$root/tests/fuzz/corpus/$target" ] && seeds=("$root/tests/fuzz/corpus/$target")
  "$build/bin/$target" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$build/crash-$target-" \
    "$grown" "${seeds[@]}"
done
echo "fuzz.sh: every target ran ${seconds} s without a crash"
