#!/usr/bin/env bash
# Checks that a virtualenv (default .venv) has exactly the Python packages
# pinned in scripts/python-requirements.txt. Prints one line, exits 1 if not.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-${MESHRUN_VENV:-.venv}}
if [ ! -x "$venv/bin/python3" ]; then
  echo "meshrun: no virtualenv at $venv: run 'bash scripts/install-deps.sh'" >&2
  exit 1
fi
"$venv/bin/python3" - scripts/python-requirements.txt "$venv" <<'PY'
import importlib.metadata as metadata
import sys

requirements, venv = sys.argv[1], sys.argv[2]
for line in open(requirements):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, pinned = line.split("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        found = None
    # Local versions (2.15.0+cu132) are the same release.
    if found is None or found.split("+")[0] != pinned:
        print(f"meshrun: {venv} has {name} {found or 'not installed'}, the project pins "
              f"{pinned}: run 'bash scripts/install-deps.sh'", file=sys.stderr)
        sys.exit(1)
print(f"{venv}: pinned packages present")
PY
