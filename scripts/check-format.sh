#!/usr/bin/env bash
# Fails when a tracked C++ file differs from clang-format's output, or the
# project's Python from ruff's format or lint rules (pyproject.toml; ruff is
# pinned in scripts/python-requirements.txt, in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' '*.cpp')
[ -n "$files" ] || exit 0
# shellcheck disable=SC2086
clang-format --dry-run --Werror --style=file $files
echo "check-format: $(echo "$files" | wc -l) files clean"
venv=${MESHRUN_VENV:-.venv}
ruff=$venv/bin/ruff
[ -x "$ruff" ] || { echo "check-format: no $ruff: run 'bash scripts/install-deps.sh'" >&2; exit 1; }
"$ruff" format --check --quiet .
"$ruff" check --quiet .
echo "check-format: $(git ls-files '*.py' | grep -vc '^examples/seeds/') Python files clean (ruff $("$ruff" --version | cut -d' ' -f2))"
