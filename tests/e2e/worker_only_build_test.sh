#!/usr/bin/env bash
# The build scripts/device-check.sh makes on the GPU machine, checked here so
# that it cannot rot between GPU sessions: -DMESHRUN_WORKER_ONLY=ON configures
# without gRPC, protobuf, spdlog or Boost, offers the device check's targets,
# and compiles mesh/process_group.cc on its no-gRPC path (the only source that
# differs there). The whole library is built and run only on the GPU machine.
#
#   worker_only_build_test.sh BUILD_DIR PYTHON
# The build lives in BUILD_DIR/worker-only-test (a fixed path, so that
# ccache, where present, serves a rerun).
set -euo pipefail
build_dir=$(cd "$1" && pwd)
python=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$build_dir/worker-only-test
rm -rf "$work"
fail() { echo "worker_only_build_test: $*"; exit 1; }

cmake -S "$src" -B "$work" -G Ninja -DMESHRUN_WORKER_ONLY=ON -DMESHRUN_PYTHON="$python" \
  -DMESHRUN_WORKER_PCH=OFF > "$work.log" 2>&1 || fail "configure failed: $(tail -20 "$work.log")"
if grep -qE '^(gRPC_DIR|Protobuf_[A-Z_]*|spdlog_DIR)[:=]' "$work/CMakeCache.txt"; then
  fail "the worker-only configure looked for gRPC, protobuf or spdlog"
fi
targets=$(ninja -C "$work" -t targets all)
for target in gpt_worker gpt_step_bench; do
  grep -q "^$target:" <<< "$targets" || fail "no target $target"
done
for target in meshrun meshrun-rdzvd meshrun_rdzv_client module_ft_worker; do
  if grep -q "^$target:" <<< "$targets"; then fail "target $target in a worker-only build"; fi
done
grep -q 'grpc_store.cc.o\|fault_tolerant.cc.o' <<< "$targets" &&
  fail "grpc_store.cc or fault_tolerant.cc in a worker-only build"
ninja -C "$work" worker_lib/CMakeFiles/meshrun_worker.dir/mesh/process_group.cc.o > "$work.build.log" 2>&1 ||
  fail "process_group.cc without gRPC: $(grep -m5 -A3 error "$work.build.log")"
echo "worker_only_build_test: ok"
