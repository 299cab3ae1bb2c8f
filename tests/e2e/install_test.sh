#!/usr/bin/env bash
# cmake --install into a temporary prefix, then examples/cpp-project built
# against that prefix alone (a copy outside the source tree, found through
# find_package(meshrun) and the venv's torch) and run under the installed
# meshrun (issue 20).
#
#   install_test.sh BUILD_DIR PYTHON
# The prefix and the project's build live in BUILD_DIR/install-test (fixed
# paths, so that ccache, where present, serves a rerun).
set -euo pipefail
build_dir=$(cd "$1" && pwd)
python=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$build_dir/install-test
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"
fail() { echo "install_test: $*"; exit 1; }
start=$(date +%s)

cmake --install "$build_dir" --prefix "$prefix" > "$work/install.log" ||
  fail "cmake --install failed: $(cat "$work/install.log")"
for f in bin/meshrun bin/meshrun-rdzvd bin/meshrun-slurm lib/libmeshrun_worker.a \
         include/meshrun/worker_lib/mesh/device_mesh.h include/meshrun/worker_lib/parallel/dp.h \
         include/meshrun/worker_lib/training/module_trainer.h include/meshrun/worker_lib/models/gpt.h \
         lib/cmake/meshrun/meshrunConfig.cmake lib/cmake/meshrun/meshrunConfigVersion.cmake \
         lib/systemd/system/meshrun-rdzvd.service etc/default/meshrun-rdzvd \
         share/meshrun/health-checks/10-gpu share/meshrun/health-checks/20-disk \
         share/meshrun/health-checks/30-clock; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
# Internal headers stay internal, and every header installed includes only
# installed ones (or absl's, libtorch's and the standard library's).
[ ! -e "$prefix/include/meshrun/worker_lib/mesh/grpc_store.h" ] || fail "grpc_store.h installed"
[ "$(cd "$prefix/include/meshrun" && echo *)" = worker_lib ] ||
  fail "include/meshrun holds more than worker_lib: $(ls "$prefix/include/meshrun")"
while read -r header included; do
  [ -e "$prefix/include/meshrun/$included" ] ||
    fail "$header includes \"$included\", which is not installed"
done < <(cd "$prefix/include/meshrun" &&
         grep -ro '^#include "[^"]*"' . | sed 's|:#include "| |; s|"$||' |
         grep -v ' absl/')

version=$("$prefix/bin/meshrun" --version)
[[ $version =~ ^meshrun\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]{12}(-dirty)?|unknown)\)$ ]] ||
  fail "meshrun --version printed '$version'"
[ "$("$prefix/bin/meshrun-rdzvd" --version)" = "meshrun-rdzvd ${version#meshrun }" ] ||
  fail "meshrun-rdzvd --version: $("$prefix/bin/meshrun-rdzvd" --version)"
# meshrun-slurm runs the meshrun beside it (the prefix is not on PATH).
[ "$(env -u MESHRUN PATH=/usr/bin:/bin "$prefix/bin/meshrun-slurm" --version)" = "$version" ] ||
  fail "the installed meshrun-slurm did not run the installed meshrun"

project=$work/cpp-project
cp -r "$src/examples/cpp-project" "$project"
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$project" -B "$project/build" -G Ninja "${launcher[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" > "$work/configure.log" 2>&1 ||
  fail "configuring examples/cpp-project failed: $(cat "$work/configure.log")"
cmake --build "$project/build" > "$work/build.log" 2>&1 ||
  fail "building examples/cpp-project failed: $(cat "$work/build.log")"
built=$(date +%s)

# The job bounds itself (meshrun ends its workers); timeout bounds meshrun.
out=$(timeout 120 "$prefix/bin/meshrun" --standalone --nproc-per-node=4 \
        "$project/build/trainer" --steps 30 2>&1) || fail "the job failed: $out"
echo "$out"
grep -q "^trainer: 4 ranks on mesh DeviceMesh(\[\[0, 1\], \[2, 3\]\], mesh_dim_names=('dp', 'tp')), FSDP x TP, loss .* every rank holds the same model$" <<< "$out" ||
  fail "no success line from trainer"
echo "install_test: installed, built out of tree in $((built - start)) s, trained under the installed meshrun in $(($(date +%s) - built)) s"
rm -rf "$work"
