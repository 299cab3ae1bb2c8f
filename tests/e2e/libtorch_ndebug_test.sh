#!/usr/bin/env bash
# libtorch's headers as libtorch was built (issue 44): the wheel's libtorch is
# compiled with NDEBUG, and its headers differ without it (RecordFunction has
# a debug-only member; its inline inputs() asserts a flag the library never
# sets). So in every build type every translation unit that includes them
# sees NDEBUG, from the build (meshrun_torch), and no source defines or
# undefines it itself, which would give that one file other classes than the
# rest of the program. Checked on a Debug configure of the project (the type
# whose flags lack NDEBUG) through its compile_commands.json.
#   libtorch_ndebug_test.sh CMAKE PYTHON
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cmake=$1 python=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

defining=$(grep -rlE '^[[:space:]]*#[[:space:]]*(define|undef)[[:space:]]+NDEBUG\b' \
             --include='*.cc' --include='*.h' --include='*.cpp' --include='*.hpp' \
             "$root/worker_lib" "$root/tests" "$root/examples" "$root/bench" 2>/dev/null)
if [ -n "$defining" ]; then
  echo "FAIL sources that define or undefine NDEBUG themselves:"; echo "$defining"
  failures=$((failures + 1))
else
  echo "ok   no source defines or undefines NDEBUG"
fi

if ! "$cmake" -S "$root" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
       -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DMESHRUN_PYTHON="$python" \
       > "$tmp/configure.log" 2>&1; then
  echo "FAIL the Debug configure failed:"; tail -20 "$tmp/configure.log"
  exit 1
fi
if ! "$python" - "$tmp/build/compile_commands.json" <<'PY'; then failures=$((failures + 1)); fi
import json, sys
commands = json.load(open(sys.argv[1]))
torch = [c for c in commands if "/torch/include" in c["command"]]
missing = [c["file"] for c in torch if "-DNDEBUG" not in c["command"].split()]
if not torch or missing:
    print(f"FAIL Debug: {len(missing)} of {len(torch)} compiles on libtorch's headers "
          "without NDEBUG:", *missing[:10], sep="\n  ")
    sys.exit(1)
print(f"ok   Debug: all {len(torch)} compiles on libtorch's headers define NDEBUG")
PY
[ "$failures" -eq 0 ]
