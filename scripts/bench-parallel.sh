#!/usr/bin/env bash
# Training-step time at world 4 (issues 5, 16, 29): meshrun's DistributedDataParallel,
# FullyShard and DDP x TP on a torch::nn MLP (C++, bench/worker_lib/dp_step_bench.cc) side by side with PyTorch DDP and FSDP2's
# fully_shard (torch 2.15 from the project's venv, gloo, bench/worker_lib/ddp_step_bench.py)
# on the same MLPs and batch, all launched by `meshrun --standalone`, in one run;
# records bench/worker_lib/parallel_results.md. See
# bench/worker_lib/bench_parallel.py for what is measured and how.
#
#   scripts/bench-parallel.sh                 # ~5-10 minutes on 2 loaded cores
#   scripts/bench-parallel.sh --rounds 1      # quick look
#   scripts/bench-parallel.sh --baseline /tmp/old/dp_step_bench   # before vs after, interleaved
#
#   scripts/bench-parallel.sh --layouts       # every parity layout, meshrun vs PyTorch 2
#   scripts/bench-parallel.sh --layouts tp pp_1f1b:mlp --steps 10   # some
#
# --layouts (first): bench/worker_lib/bench_layouts.py times train_example
# against tests/parity/torch_parallel.py (DDP, FSDP2, TP, FSDP2 + TP, the
# pipelining schedules, DP x TP x PP) on every layout of
# tests/parity/layouts.py and records bench/worker_lib/layouts_results.md;
# the arguments after it go to bench_layouts.py (layouts, --steps, --warmup,
# --rounds, --models, --sizes, --threads). --models gpt times the torch::nn
# GPT (gpt_worker against tests/parity/torch_gpt.py) instead:
#   RESULTS_DIR=bench/worker_lib/module scripts/bench-parallel.sh --layouts --models gpt
#
# Extra arguments go to bench_parallel.py (--rounds, --models, --batch,
# --steps, --impls, --world, --baseline, --baseline-impls). Environment:
#   BUILD_DIR    build directory (default build/; configured with benchmarks if missing)
#   RESULTS_DIR  where parallel_results.md goes (default bench/worker_lib)
#   JOBS         ninja -j (default 2)
#   WAIT_QUIET   seconds to wait for a quiet machine first (default 60)
#   NO_BUILD     1: use BUILD_DIR's binaries as they are (say, while another
#                ninja runs there), without configuring or building
#   MESHRUN_VENV the virtualenv with the pinned torch (default .venv)
#   PYTHON_EXEC  the Python that runs ddp_step_bench.py (default the venv's python3)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
results_dir=${RESULTS_DIR:-bench/worker_lib}
jobs=${JOBS:-2}
wait_quiet=${WAIT_QUIET:-60}
layouts=0
if [ "${1:-}" = --layouts ]; then
  layouts=1
  shift
fi
binaries=(dp_step_bench meshrun meshrun-rdzvd)
[ "$layouts" = 1 ] && binaries=(train_example gpt_worker meshrun meshrun-rdzvd)

source scripts/lib/bench-common.sh
build_binaries bench-parallel "${binaries[@]}"
find_torch bench-parallel
python_exec=${PYTHON_EXEC:-$venv_python}
ddp_torch=$("$python_exec" -c 'import torch.distributed; print(torch.__version__)' 2>/dev/null) ||
  { echo "bench-parallel: $python_exec cannot import torch.distributed (PYTHON_EXEC)" >&2; exit 1; }
wait_for_quiet bench-parallel "$wait_quiet"

mkdir -p "$results_dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$layouts" = 1 ]; then
  cmd=("$venv_python" bench/worker_lib/bench_layouts.py
       --meshrun "$build_dir/bin/meshrun" --train-example "$build_dir/bin/train_example"
       --gpt-worker "$build_dir/bin/gpt_worker" --python "$python_exec" --raw "$tmp/raw" "$@")
  invocation="scripts/bench-parallel.sh --layouts${*:+ $*}"
else
  cmd=("$venv_python" bench/worker_lib/bench_parallel.py
       --meshrun "$build_dir/bin/meshrun" --dp-step-bench "$build_dir/bin/dp_step_bench"
       --ddp-script bench/worker_lib/ddp_step_bench.py --python "$python_exec" --raw "$tmp/raw" "$@")
  invocation="scripts/bench-parallel.sh${*:+ $*}"
fi
for var in PYTHON_EXEC MESHRUN_VENV JOBS RESULTS_DIR BUILD_DIR WAIT_QUIET NO_BUILD; do
  [ -n "${!var:-}" ] && invocation="$var=${!var} $invocation"
done
mark_start
run_driver "${cmd[@]}"
cat "$tmp/stdout"

# The run's facts, the same in both results files.
run_facts() {
  echo "- Command: \`$invocation\`, which ran \`${cmd[*]}\`"
  echo "- Date: $started (took ${elapsed} s)"
  machine_line
  echo "- meshrun: $tree, built in $build_dir"
  echo "- libtorch: torch $torch_version's (the venv's wheel); PyTorch: torch $ddp_torch" \
       "($python_exec, $("$python_exec" --version 2>&1)); Gloo on CPU"
  echo "- Load average (1/5/15 min) before: $load_before; after: $load_after. The machine is"
  echo "  shared with other engineers' builds and tests: absolute times are inflated and noisy;"
  echo "  compare medians and ratios within this run only."
  echo "- Exit status: $status"
}
if [ "$layouts" = 1 ]; then
  {
    echo "# Parallel layouts benchmark: meshrun's worker library vs PyTorch 2 (step time, every parity layout)"
    echo
    echo "Produced by \`scripts/bench-parallel.sh --layouts\` (bench/worker_lib/bench_layouts.py,"
    echo "train_example --time-steps, tests/parity/torch_parallel.py --time-steps); do not edit by hand."
    echo
    run_facts
    echo
    echo "## Method"
    echo
    echo "- Layouts and models: tests/parity/layouts.py, as scripts/parity-torch.sh runs them"
    echo "  (world 4; dp_tp_pp world 8, pp 2 x dp 2 x tp 2), at the \"bench\" sizes unless --sizes says"
    echo "  otherwise. The same initial weights (train_example's) and batches on both sides."
    echo "- Every launch: \`meshrun --standalone --nproc-per-node=WORLD --no-python\` of either"
    echo "  \`train_example --time-steps\` (the torch::nn MLP of mlp.h through ModuleTrainer) or"
    echo "  \`PYTHON tests/parity/torch_parallel.py --time-steps\` (DistributedDataParallel,"
    echo "  fully_shard, parallelize_module + loss_parallel, PipelineStage + ScheduleGPipe /"
    echo "  Schedule1F1B / ScheduleInterleaved1F1B, replicate), same launcher for both sides,"
    echo "  OMP_NUM_THREADS the same for every rank; the two sides alternate who goes first."
    echo "- Model gpt: \`gpt_worker --time-steps\` (the torch::nn GPT of worker_lib/models/gpt.h"
    echo "  under FullyShard, DistributedDataParallel, ParallelizeModule + LossParallel, MakeStage;"
    echo "  its initial weights) against \`PYTHON tests/parity/torch_gpt.py --time-steps\` (its"
    echo "  Python twin under the same PyTorch APIs), both with AdamW."
    echo "- A step: barrier, then zero_grad + forward + loss + backward + gradient sync + SGD"
    echo "  (AdamW for gpt) step + the global loss's all-reduce; per step the slowest rank; per"
    echo "  launch the median of the steps after warm-up; over rounds the median of the launch"
    echo "  medians."
    echo "- Memory: the largest rank's peak RSS (getrusage) and its growth over the RSS before"
    echo "  the model was built; Python's peak includes the interpreter and torch's modules, so"
    echo "  for FSDP2 compare growth."
    echo
    echo "## Results"
    echo
    cat "$tmp/stdout"
    bench_logs "each launch's command and its per-step times, ms"
  } > "$results_dir/layouts_results.md"
  strip_checkout_paths "$results_dir/layouts_results.md"
  echo "bench-parallel: wrote $results_dir/layouts_results.md" >&2
  exit "$status"
fi
{
  echo "# Parallel training benchmark: meshrun DDP / FSDP / DDP x TP vs PyTorch DDP / FSDP2 (step time, world 4)"
  echo
  echo "Produced by \`scripts/bench-parallel.sh\` (bench/worker_lib/bench_parallel.py,"
  echo "dp_step_bench.cc, ddp_step_bench.py); do not edit by hand."
  echo
  run_facts
  echo
  echo "## Method"
  echo
  echo "- Every launch: \`meshrun --standalone --nproc-per-node=4 --no-python\` of"
  echo "  \`dp_step_bench --mode {module_ddp,module_fsdp,module_fsdp_noreshard,module_dptp}\` (C++: a"
  echo "  torch::nn::Sequential of Linear and ReLU under DistributedDataParallel::Wrap with 25 MiB"
  echo "  buckets, or FullyShard on every Linear and the root; torch::optim::SGD) or"
  echo "  \`\$PYTHON_EXEC ddp_step_bench.py --mode {ddp,fsdp2,fsdp2_noreshard}\` (nn.Sequential of the"
  echo "  same Linear/ReLU sizes in DistributedDataParallel with its default 25 MiB buckets, or"
  echo "  fully_shard on every Linear and the root, reshard_after_forward True / False;"
  echo "  torch.optim.SGD). OMP_NUM_THREADS=1 (meshrun's default for several workers) for all."
  echo "- \`--baseline PATH\`: the modes of \`--baseline-impls\` also run by that dp_step_bench"
  echo "  binary (built from an earlier commit), interleaved with the rest (\", baseline\" rows)."
  echo "- Memory: each binary reports its largest rank's peak RSS (getrusage) and the growth of"
  echo "  that over the RSS just before the model was built; the Python peers' RSS includes the"
  echo "  interpreter and torch's Python modules, so compare growth, not peak, across languages."
  echo "- A step = zero_grad + forward + MSE loss + backward + gradient sync + SGD step, on this"
  echo "  rank's 1/4 of the global batch; data is generated before the clock starts; a barrier"
  echo "  precedes every step; a step's time is the slowest rank's; per launch the median of the"
  echo "  timed steps after warm-up; reported: the median over rounds of the launch medians."
  echo "- DDP and meshrun's DistributedDataParallel both start a bucket's all-reduce during"
  echo "  backward once its grads are in. meshrun's FullyShard and FSDP2 both gather a unit's"
  echo "  params with one all-gather and reduce-scatter its grads with one reduce-scatter,"
  echo "  prefetching the next unit's all-gather; meshrun's hooks are RecordFunction first-touch"
  echo "  observers (fully_shard.h)."
  echo "- \`--mode module_dptp\`: mesh (2, 2) [dp, tp]; ParallelizeModule pairing the Linears"
  echo "  column -> row-wise over tp, DistributedDataParallel over dp; the two tp ranks of a dp"
  echo "  rank share its half of the batch."
  echo
  echo "## Results"
  echo
  cat "$tmp/stdout"
  bench_logs "RESULT / STEPS lines of rank 0"
} > "$results_dir/parallel_results.md"
strip_checkout_paths "$results_dir/parallel_results.md"
echo "bench-parallel: wrote $results_dir/parallel_results.md" >&2
exit "$status"
