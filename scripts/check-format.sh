#!/usr/bin/env bash
# Fails when a tracked C++ file differs from clang-format's output.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' '*.cpp')
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
clang-format --dry-run --Werror --style=file $files
echo "check-format: $(echo "$files" | wc -l) files clean"
