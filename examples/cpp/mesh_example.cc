// Seed 000's first DeviceMesh experiment, in C++: each rank prints its global
// rank and its sub-mesh along one dimension.
//
//   meshrun --standalone --nproc-per-node=6 build/bin/mesh_example --shape 2,3
//   Rank: 4, DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))
//
// Options: --shape (required), --names (default by rank count: tp / dp,tp /
// dp,cp,tp / pp,dp,cp,tp), --no-names (a mesh without names, which cannot be
// sliced), --slice (the names to slice, default: the last one), --device
// (default cpu). A DeviceMesh error prints PyTorch's message and exits 1.

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"

namespace {

int Fail(const absl::Status& status) {
  // One write per line, so ranks' lines do not interleave.
  std::cerr << std::string(status.message()) + "\n" << std::flush;
  return 1;
}

std::optional<std::vector<std::string>> DefaultNames(size_t ndim) {
  static const std::vector<std::vector<std::string>> kNames = {
      {"tp"}, {"dp", "tp"}, {"dp", "cp", "tp"}, {"pp", "dp", "cp", "tp"}};
  if (ndim == 0 || ndim > kNames.size()) return std::nullopt;
  return kNames[ndim - 1];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Prints each rank's DeviceMesh slice (seed 000's first experiment).");
  std::vector<int> shape;
  std::vector<std::string> names;
  std::vector<std::string> slice;
  bool no_names = false;
  std::string device = "cpu";
  app.add_option("--shape", shape, "mesh shape, e.g. 2,3")->required()->delimiter(',');
  app.add_option("--names", names, "mesh dimension names, e.g. dp,tp")->delimiter(',');
  app.add_flag("--no-names", no_names, "create the mesh without dimension names");
  app.add_option("--slice", slice, "names to slice (default: the last name)")
      ->delimiter(',');
  app.add_option("--device", device, "device type");
  CLI11_PARSE(app, argc, argv);

  std::optional<std::vector<std::string>> mesh_names;
  if (!no_names) {
    mesh_names = names.empty() ? DefaultNames(shape.size()) : names;
    if (!mesh_names) {
      std::cerr << "--names is required for a " << shape.size() << "-D mesh\n";
      return 2;
    }
  }
  if (slice.empty()) slice = {mesh_names ? mesh_names->back() : "tp"};

  auto world = meshrun::worker::InitProcessGroup("gloo");
  if (!world.ok()) return Fail(world.status());
  auto mesh = meshrun::worker::InitDeviceMesh(*world, device, shape, mesh_names);
  if (!mesh.ok()) return Fail(mesh.status());
  auto sub = mesh->Slice(slice);
  if (!sub.ok()) return Fail(sub.status());
  std::cout << "Rank: " + std::to_string((*world)->rank()) + ", " + sub->ToString() + "\n"
            << std::flush;
  return 0;
}
