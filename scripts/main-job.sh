#!/usr/bin/env bash
# The README's main job: parallel training of a small transformer LM on a 2-D
# mesh, dp=2 x tp=2 (build/bin/train_example, C++ on libtorch, gloo on CPU),
# 4 workers under `meshrun --standalone` with its embedded rendezvous daemon.
# --verify makes every rank also train the whole model in one process and
# check each step's loss and the final parameters against it. Installs and
# builds first. Extra arguments go to train_example (e.g. --pp 2 --tp 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
exec build/bin/meshrun --standalone --nproc-per-node=4 --max-restarts=1 \
  build/bin/train_example --model transformer --dp 2 --tp 2 --steps 20 --lr 0.5 --verify "$@"
