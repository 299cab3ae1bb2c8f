#!/usr/bin/env bash
# Golden parity of meshrun's C++ worker library with PyTorch 2's own
# parallelisms (issues 16, 29): for each layout, the same model
# (train_example's torch::nn MLP of worker_lib/models/mlp.h, and
# gpt_worker's torch::nn GPT of worker_lib/models/gpt.h against its Python
# twin) trained from the same
# initial weights on the same batches by meshrun (under `meshrun --standalone
# --no-python`) and by PyTorch (DDP, FSDP2, DTensor TP, pipelining under
# `torchrun --standalone`, the control); one line per layout:
#
#   scripts/parity-torch.sh                 # every layout, 20 steps (~10-20 min loaded)
#   scripts/parity-torch.sh tp fsdp_tp      # some
#   ddp max_rel_diff=4.7e-08 (mlp 4.7e-08, gpt 3.1e-07; ...)
#
# X = the largest relative difference of the per-step losses and of the
# final parameters (norm of the difference / norm of torch's, per tensor);
# exits 1 when any X > 1e-5 or a side fails. Layouts and models:
# tests/parity/layouts.py; the driver: tests/parity/parity.py (its flags, e.g.
# --steps, --models, --work DIR to keep the logs, pass through).
# Environment: BUILD_DIR (default build/), JOBS (ninja -j, default 2),
# MESHRUN_VENV (the venv with the pinned torch, default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-2}

if [ ! -f "$build_dir/build.ninja" ]; then
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -G Ninja > "$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
fi
ninja -C "$build_dir" -j"$jobs" train_example gpt_worker meshrun > "$build_dir.parity-build.log" 2>&1 ||
  { tail -20 "$build_dir.parity-build.log" >&2;
    echo "parity-torch: cannot build train_example, gpt_worker and meshrun" >&2; exit 1; }

source scripts/lib/bench-common.sh
find_torch parity-torch
exec "$venv_python" tests/parity/parity.py \
  --meshrun "$build_dir/bin/meshrun" --train-example "$build_dir/bin/train_example" \
  --gpt-worker "$build_dir/bin/gpt_worker" \
  --torchrun "$venv_torchrun" "$@"
