#!/usr/bin/env bash
# The README's main job: a real DDP training run (examples/ddp_train.py, gloo
# on CPU) of 4 workers under `meshrun --standalone`, with its embedded
# rendezvous daemon. Installs and builds first. Extra arguments go to the
# training script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
# Debian's python3-torch lives under /usr/bin/python3; a python3 earlier on
# PATH may lack torch.
export PYTHON_EXEC=${PYTHON_EXEC:-/usr/bin/python3}
exec build/bin/meshrun --standalone --nproc-per-node=4 --max-restarts=1 \
  examples/ddp_train.py --epochs 5 "$@"
