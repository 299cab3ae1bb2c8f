#!/usr/bin/env bash
# Bad input for the project's one torch: a missing venv, a venv without torch
# and a venv with another torch each give exactly one line naming what was
# found and how to install, and exit 1, from both scripts/check-venv.sh and
# the configure step of scripts/build.sh. The fake venvs are real virtualenvs
# on Debian's python3; the "other torch" is a package that only claims a version.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect_one_line() {  # NAME WANT_SUBSTRING COMMAND...
  local name=$1 want=$2
  shift 2
  local out code
  out=$("$@" 2>&1)
  code=$?
  if [ "$code" -ne 1 ] || [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] ||
     [[ "$out" != *"$want"* ]]; then
    echo "FAIL $name: exit $code, output:"; printf '%s\n' "$out"
    failures=$((failures + 1))
  else
    echo "ok   $name: $out"
  fi
}

/usr/bin/python3 -m venv "$tmp/no-torch"
/usr/bin/python3 -m venv "$tmp/other-torch"
site=$("$tmp/other-torch/bin/python3" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site/torch" "$site/torch-2.3.0.dist-info"
echo '__version__ = "2.3.0+cpu"' > "$site/torch/__init__.py"
echo 'cmake_prefix_path = "/nonexistent"' > "$site/torch/utils.py"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.3.0\n' > "$site/torch-2.3.0.dist-info/METADATA"

expect_one_line "check-venv, missing" "no virtualenv at $tmp/missing" \
  bash "$root/scripts/check-venv.sh" "$tmp/missing"
expect_one_line "check-venv, other torch" "has torch 2.3.0, the project pins" \
  bash "$root/scripts/check-venv.sh" "$tmp/other-torch"
for venv in missing no-torch other-torch; do
  case $venv in
    missing) want="no Python at $tmp/missing/bin/python3" ;;
    no-torch) want="cannot import torch" ;;
    other-torch) want="has torch 2.3.0+cpu, the project pins" ;;
  esac
  expect_one_line "configure, $venv" "$want" \
    env BUILD_DIR="$tmp/build-$venv" bash "$root/scripts/build.sh" -DMESHRUN_VENV="$tmp/$venv"
done
[ "$failures" -eq 0 ]
