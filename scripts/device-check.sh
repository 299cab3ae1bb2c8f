#!/usr/bin/env bash
# The worker library on CUDA (issue 29): builds meshrun_worker on a GPU machine
# and trains the plain-libtorch GPT (worker_lib/models/gpt.h) there under
# every layout over NCCL, then compares its step time with PyTorch's on the
# Python twin (gpt.py).
#
# The GPU machine has libtorch (a CUDA torch for Python), a compiler, CMake,
# ninja and nvcc, but no Debian packages and no network. So it builds the
# worker library alone (-DMESHRUN_WORKER_ONLY=ON: no gRPC, so no meshrun
# store client and no fault-tolerant replicas) against that machine's own
# torch, and what the library needs besides libtorch travels with the
# working tree as an extracted bundle of Debian 12 packages:
#   .device/bundle/usr  libabsl-dev + libabsl20220623 (headers, CMake config,
#                       shared libraries), libcli11-dev (header-only),
#                       libgloo-dev (headers ProcessGroupGloo.hpp includes)
# Its launcher is that torch's own torchrun: the workers are c10d TCPStore
# clients of torchrun's agent store, as under meshrun.
#
#   bash scripts/device-check.sh bundle   # here (Debian 12, apt): .device/bundle
#   bash scripts/device-check.sh run      # there, from the repository root,
#                                         # with .device carried
#   bash scripts/device-check.sh ft       # meshrun.ft's part alone (anywhere:
#                                         # without CUDA it runs its CPU part)
#   bash scripts/device-check.sh wheel    # the pip wheel's part alone (anywhere:
#                                         # without CUDA, install and --version)
#
# run: device placement (device_placement_worker: the current device after
# InitProcessGroup, FullyShard's gathered parameters on their device, with
# another GPU made current where there are two), then world-1 NCCL, every
# layout of gpt_worker at size 1 on cuda:0 (each against one process on the
# same GPU: every step's loss and the final parameters within rtol 1e-5),
# every layout again on all GPUs where there are several (else a SKIP line
# saying why), meshrun.ft's replica dimension on CUDA (issue 44:
# tests/device/ft_nccl_check.py: a replica group on cuda:0 healed over Gloo
# from a CPU peer, an NCCL group whose peer never comes failing within its
# timeout without taking the process down, and with two GPUs a peer dying
# between all-reduces), FullyShard's lifecycle cases (issue 45:
# fsdp_lifecycle_worker --device cuda), then gpt_step_bench against
# gpt_step_bench.py (layouts none, ddp, fsdp). Logs and summary.txt land in
# $OUT (or .device/out). Exit 0 when every layout and ft check passed.
#
# wheel (issue 46 item 4; run does it first): the pip wheel that `bundle`
# copied from dist/ (scripts/build-wheel.sh) is pip-installed, without the
# network, into the environment of that machine's python3 (its own CUDA
# torch, grpcio and protobuf are there already), and its `meshrun` launches
# an NCCL DDP job (tests/device/ddp_nccl.py) on every GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/.device/bundle

make_bundle() {
  local debs
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download libabsl-dev libabsl20220623 libcli11-dev libgloo-dev)
  rm -rf "$bundle"
  mkdir -p "$bundle"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$bundle"; done
  rm -rf "$debs" "$bundle/usr/share/doc"
  # The pip wheel, for wheel_check.
  local wheels=("$root"/dist/meshrun-*.whl)
  [ -f "${wheels[0]}" ] || { echo "device-check: no wheel in dist/: run scripts/build-wheel.sh first" >&2; exit 2; }
  mkdir -p "$bundle/wheel"
  cp "${wheels[@]}" "$bundle/wheel/"
  du -sh "$bundle"
}

# The pip wheel on the GPU machine; appends its PASS/FAIL/SKIP lines to $1
# (a summary), its log beside it. Returns 1 when a check failed.
wheel_check() {
  local summary=$1 python=${PYTHON:-python3}
  local log=${summary%/*}/wheel.log
  local wheels=("$bundle"/wheel/meshrun-*.whl)
  if [ ! -f "${wheels[0]}" ]; then
    echo "FAIL wheel: none in $bundle/wheel (bundle copies it from dist/)" | tee -a "$summary"
    return 1
  fi
  # --no-deps: grpcio and protobuf are that machine's own (the launcher's
  # binaries need neither; meshrun's Python modules import them).
  if ! "$python" -m pip install -q --no-index --no-deps --no-compile --force-reinstall \
       "${wheels[0]}" > "$log" 2>&1; then
    echo "FAIL wheel install: $(tail -2 "$log" | tr '\n' ' ')" | tee -a "$summary"
    return 1
  fi
  local bin
  bin=$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  local command version versions=()
  for command in meshrun meshrun-rdzvd meshrun-slurm; do
    if ! version=$("$bin/$command" --version 2>&1) ||
       [[ ! $version =~ ^meshrun(-rdzvd)?\ [0-9.]+\ \(commit ]]; then
      echo "FAIL wheel $command --version: $(echo "$version" | head -2 | tr '\n' ' ')" | tee -a "$summary"
      return 1
    fi
    versions+=("$version")
  done
  echo "PASS wheel install into $bin: ${versions[*]}" | tee -a "$summary"
  if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2> /dev/null; then
    echo "SKIP wheel NCCL DDP: no CUDA (or no torch) for $python" | tee -a "$summary"
    return 0
  fi
  local gpus
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  # The wheel's launcher picks the python3 beside it (this venv's, with its
  # CUDA torch): no PYTHON_EXEC.
  if (cd "${summary%/*}" && timeout 300 "$bin/meshrun" --standalone --nproc-per-node="$gpus" \
        "$root/tests/device/ddp_nccl.py") >> "$log" 2>&1 && grep -q '^DDP_NCCL .* ok$' "$log"; then
    echo "PASS wheel NCCL DDP: $(grep -m1 '^DDP_NCCL' "$log")" | tee -a "$summary"
  else
    echo "FAIL wheel NCCL DDP: $(grep -m3 -h 'FAIL\|rror\|^DDP_NCCL' "$log" | tr '\n' ' ')" | tee -a "$summary"
    return 1
  fi
}

# meshrun.ft on CUDA; appends its PASS/FAIL/SKIP lines to $1 (a summary),
# its log beside it. Returns 1 when a check failed.
ft_check() {
  local summary=$1 python=${PYTHON:-python3} dry=()
  local log=${summary%/*}/ft.log
  "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' || dry=(--dry)
  if PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH} timeout 400 \
       "$python" "$root/tests/device/ft_nccl_check.py" "${dry[@]}" > "$log" 2>&1; then
    grep -E '^(PASS|FAIL|SKIP) ft' "$log" | tee -a "$summary"
  else
    grep -E '^(PASS|FAIL|SKIP) ft' "$log" | tee -a "$summary"
    echo "FAIL ft check (exit or timeout): $(tail -3 "$log" | tr '\n' ' ')" | tee -a "$summary"
    return 1
  fi
}

run_check() {
  local out=${OUT:-$root/.device/out}
  mkdir -p "$out"
  local summary=$out/summary.txt
  : > "$summary"
  say() { echo "$*" | tee -a "$summary"; }
  local python=${PYTHON:-python3}
  [ -d "$bundle/usr" ] || { echo "device-check: no $bundle: run 'bash scripts/device-check.sh bundle' first and carry .device" >&2; exit 2; }
  local torch_dir
  torch_dir=${TORCH_DIR:-}
  [ -n "$torch_dir" ] || torch_dir=$("$python" -c 'import torch.utils, os; print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))')
  say "torch $("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
  say "gpus $(nvidia-smi -L | tr '\n' ';')"
  local gpus
  gpus=$(nvidia-smi -L | grep -c '^GPU')

  local build=${BUILD_DIR:-/tmp/meshrun-device-build}
  local start=$SECONDS
  say "compiler $(c++ --version | head -1); $(cmake --version | head -1); nvcc $(nvcc --version | grep -o 'release [0-9.]*')"
  # -include cstdint: abseil 20220623's headers lean on <string> including
  # it, which GCC 13 (Ubuntu 24.04's) no longer does.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="-include cstdint" \
    -DMESHRUN_WORKER_ONLY=ON -DTorch_DIR="$torch_dir" \
    -DCMAKE_PREFIX_PATH="$bundle/usr" -DMESHRUN_GLOO_INCLUDE_DIR="$bundle/usr/include" \
    > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  ninja -C "$build" -j "$(nproc)" gpt_worker gpt_step_bench device_placement_worker \
    fsdp_lifecycle_worker \
    >> "$out/build.log" 2>&1 ||
    { grep -m 20 -A 5 'error' "$out/build.log"; exit 1; }
  say "build $((SECONDS - start)) s ($(grep -c 'Building CXX' "$out/build.log") sources, $(nproc) cores)"
  export LD_LIBRARY_PATH=$bundle/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local torchrun=("$python" -m torch.distributed.run --standalone --no-python)
  local failed=0
  wheel_check "$summary" || failed=1

  # Device placement (issue 44): InitProcessGroup("nccl") makes LOCAL_RANK's
  # GPU current, and FullyShard's gathered parameters (allocated through the
  # storage's allocator, which CUDA's caching allocator serves on the
  # *current* device) land on the parameters' device under a DeviceGuard.
  # On one GPU the current device and the parameters' are the same one, so
  # this checks the NCCL path, the current device and the placement, not the
  # guard itself; with two GPUs or more each rank makes another GPU current
  # after InitProcessGroup (--other-current-device) and the gathered storage
  # must still be on cuda:LOCAL_RANK, which without the guard it is not.
  local placement=(--device cuda)
  local placement_nproc=1
  if [ "$gpus" -ge 2 ]; then placement=(--device cuda --other-current-device); placement_nproc=2; fi
  if timeout 120 "${torchrun[@]}" --nproc-per-node="$placement_nproc" \
       "$build/bin/device_placement_worker" "${placement[@]}" > "$out/placement.log" 2>&1; then
    say "PASS placement world $placement_nproc ${placement[*]}: $(grep -m1 'PLACED rank 0' "$out/placement.log")"
  else
    failed=1
    say "FAIL placement world $placement_nproc: $(grep -m3 -h 'FAIL\|rror' "$out/placement.log" | tr '\n' ' ')"
  fi
  [ "$gpus" -ge 2 ] ||
    say "SKIP placement with another current device: $gpus GPU (the guard's case needs two)"

  # Each layout in its own torchrun, all at once (one GPU holds them all).
  local layouts=(ddp fsdp fsdp_noreshard hsdp tp fsdp_tp pp_gpipe pp_1f1b dp_tp_pp)
  run_layouts() {
    local nproc=$1 pids=() layout
    for layout in "${layouts[@]}"; do
      timeout 300 "${torchrun[@]}" --nproc-per-node="$nproc" "$build/bin/gpt_worker" \
        --layout "$layout" --device cuda > "$out/layouts-$nproc.$layout.log" 2>&1 &
      pids+=($!)
    done
    local i
    for i in "${!layouts[@]}"; do
      layout=${layouts[$i]}
      if wait "${pids[$i]}"; then
        say "PASS world $nproc $layout: $(grep -m1 'DONE rank 0' "$out/layouts-$nproc.$layout.log")"
      else
        failed=1
        say "FAIL world $nproc $layout: $(grep -m3 -h 'FAIL\|rror' "$out/layouts-$nproc.$layout.log" | tr '\n' ' ')"
      fi
    done
    cat "$out"/layouts-"$nproc".*.log > "$out/layouts-$nproc.log"
    rm -f "$out"/layouts-"$nproc".*.log
  }
  run_layouts 1
  if [ "$gpus" -ge 2 ]; then
    run_layouts "$((gpus >= 8 ? 8 : (gpus >= 4 ? 4 : 2)))"
  else
    say "SKIP multi-GPU layouts: $gpus GPU (NCCL puts one rank on a GPU)"
  fi

  ft_check "$summary" || failed=1

  # FullyShard's lifecycle (issue 45) over NCCL, each case against a
  # reference trained on the same GPU: a backward that throws while a
  # reduce-scatter is in flight on NCCL's stream (FSDP and DDP), a weight
  # tied across units, two models from two threads (two communicators
  # launching at once), frozen Linears, gradient accumulation, eval forwards,
  # writes, models rebuilt at one address. One rank a GPU: all GPUs, at most 2.
  local lifecycle_nproc=$((gpus >= 2 ? 2 : 1)) case_args
  local lifecycle_cases=("exception" "exception --ddp" "tied" "threads --steps 200" \
    "frozen --steps 4" "accumulate --steps 4" "eval --count 2000" "writes" "rebuild --count 5")
  for case_args in "${lifecycle_cases[@]}"; do
    # shellcheck disable=SC2086
    if timeout 300 "${torchrun[@]}" --nproc-per-node="$lifecycle_nproc" \
         "$build/bin/fsdp_lifecycle_worker" --device cuda --case $case_args \
         > "$out/lifecycle.log.part" 2>&1; then
      say "PASS lifecycle world $lifecycle_nproc $case_args"
    else
      failed=1
      say "FAIL lifecycle world $lifecycle_nproc $case_args: $(grep -m3 -h 'FAIL\|rror' "$out/lifecycle.log.part" | tr '\n' ' ')"
    fi
    cat "$out/lifecycle.log.part" >> "$out/lifecycle.log"
  done
  rm -f "$out/lifecycle.log.part"

  # Step time on one GPU: meshrun's module API against PyTorch's, alternating,
  # BENCH_ROUNDS times (2; 0 skips it, when device time is short).
  local rounds=${BENCH_ROUNDS:-2}
  [ "$rounds" -gt 0 ] || { say "bench skipped (BENCH_ROUNDS=0)"; return "$failed"; }
  local model=(--vocab 96 --context 256 --dim 512 --heads 8 --layers 8 --batch 16
               --steps 30 --warmup 5 --device cuda)
  local layout round
  for round in $(seq "$rounds"); do
    for layout in none ddp fsdp; do
      timeout 300 "${torchrun[@]}" --nproc-per-node=1 "$build/bin/gpt_step_bench" \
        --layout "$layout" "${model[@]}" >> "$out/bench.log" 2>&1 || say "bench meshrun $layout failed"
      timeout 300 "${torchrun[@]}" --nproc-per-node=1 "$python" \
        "$root/bench/worker_lib/module/gpt_step_bench.py" --layout "$layout" "${model[@]}" \
        >> "$out/bench.log" 2>&1 || say "bench torch $layout failed"
    done
  done
  say "bench: GPT dim 512, 8 layers, 8 heads, context 256, batch 16, fp32 AdamW, 30 steps after 5, $rounds rounds"
  "$python" - "$out/bench.log" <<'PY' | tee -a "$summary"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    if line.startswith("RESULT"):
        f = dict(kv.split("=") for kv in line.split()[1:])
        runs.setdefault((f["layout"], f["impl"]), []).append((float(f["median_ms"]), float(f["peak_mb"])))
for layout in ("none", "ddp", "fsdp"):
    m, t = runs.get((layout, "meshrun")), runs.get((layout, "torch"))
    if not m or not t:
        print(f"bench {layout}: missing results")
        continue
    mm = statistics.median(x for x, _ in m); tm = statistics.median(x for x, _ in t)
    print(f"bench {layout}: meshrun {mm:.2f} ms, torch {tm:.2f} ms, ratio {mm / tm:.2f}x; "
          f"peak meshrun {max(p for _, p in m):.0f} MiB, torch {max(p for _, p in t):.0f} MiB")
PY
  return "$failed"
}

case "${1:-}" in
  bundle) make_bundle ;;
  run) run_check ;;
  ft)
    out=${OUT:-$root/.device/out}
    mkdir -p "$out"
    : > "$out/summary.txt"
    ft_check "$out/summary.txt"
    ;;
  wheel)
    out=${OUT:-$root/.device/out}
    mkdir -p "$out"
    : > "$out/summary.txt"
    wheel_check "$out/summary.txt"
    ;;
  *) echo "usage: $0 bundle|run|ft|wheel" >&2; exit 2 ;;
esac
