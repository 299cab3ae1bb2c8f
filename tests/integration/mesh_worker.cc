// A worker for device_mesh_test, run under the real launcher:
//   meshrun --standalone --nproc-per-node=N --no-python mesh_worker --shape 2,3 --names
//   dp,tp
// Builds the mesh, prints this rank's group along each dimension
// ("GROUP <rank> <dim> <ranks>") for the test to compare with PyTorch's
// layout, then runs Gloo all-reduce, all-gather, broadcast, send/recv and
// reduce-scatter on every dimension, on the slices and on a flattened
// dimension, checking every value. With --backend nccl the same runs over
// NCCL on the GPU of the worker's LOCAL_RANK. Prints "FAIL <rank> <what>" for each
// mismatch and "DONE <rank>" at the end; exits 1 on any failure.
//
// With --errors it checks instead that DeviceMesh's runtime errors carry
// PyTorch's messages (mesh shape 2,2 with names dp,tp expected).

#include <ATen/ATen.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "worker_lib/mesh/collectives.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"

namespace {

using meshrun::worker::DeviceMesh;
using meshrun::worker::ProcessGroupPtr;
using meshrun::worker::World;

int rank_ = -1;
int failures_ = 0;

void Say(const std::string& line) { std::cout << line + "\n" << std::flush; }

void Fail(const std::string& what) {
  ++failures_;
  Say("FAIL " + std::to_string(rank_) + " " + what);
}

std::string Join(const std::vector<int>& values) { return absl::StrJoin(values, ","); }

std::vector<int> ToInts(const at::Tensor& tensor) {
  at::Tensor flat = tensor.cpu().to(at::kInt).contiguous();
  return std::vector<int>(flat.data_ptr<int>(), flat.data_ptr<int>() + flat.numel());
}

// Where the collectives' tensors live: CPU (gloo), or this rank's GPU (nccl).
at::TensorOptions options_ = at::TensorOptions().dtype(at::kFloat);

at::Tensor Floats(std::vector<float> values) {
  return at::tensor(values, at::kFloat).to(options_.device());
}

// Every collective on `group`, whose members are `members` (sorted global
// ranks; group rank = index). Values derive from global ranks, so a group
// wired to the wrong ranks gives wrong sums.
void CheckCollectives(World& world, c10d::ProcessGroup& group, const std::string& what) {
  const std::vector<int> members = world.GroupRanks(group);
  const int n = group.getSize();
  const int me = group.getRank();
  if (static_cast<int>(members.size()) != n || me < 0 || members[me] != rank_) {
    Fail(what + " membership " + Join(members) + " size " + std::to_string(n) + " rank " +
         std::to_string(me));
    return;
  }
  // all-reduce: sum of (rank + 1).
  {
    std::vector<at::Tensor> tensors{Floats({rank_ + 1.0f, 2.0f * rank_})};
    group.allreduce(tensors)->wait();
    float sum = 0;
    for (int r : members) sum += r + 1.0f;
    std::vector<int> got = ToInts(tensors[0]);
    if (got != std::vector<int>{static_cast<int>(sum), static_cast<int>(2 * (sum - n))})
      Fail(what + " allreduce " + Join(got));
  }
  // all-gather: every member's rank, in group-rank order.
  {
    std::vector<at::Tensor> input{Floats({static_cast<float>(rank_)})};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int i = 0; i < n; ++i) output[0].push_back(at::zeros({1}, options_));
    group.allgather(output, input)->wait();
    std::vector<int> got;
    for (const auto& tensor : output[0]) got.push_back(ToInts(tensor)[0]);
    if (got != members) Fail(what + " allgather " + Join(got));
  }
  // broadcast from each group rank in turn.
  for (int root = 0; root < n; ++root) {
    std::vector<at::Tensor> tensors{
        Floats({me == root ? 1000.0f + rank_ : -1.0f, me == root ? 7.0f : 0.0f})};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group.broadcast(tensors, options)->wait();
    std::vector<int> got = ToInts(tensors[0]);
    if (got != std::vector<int>{1000 + members[root], 7})
      Fail(what + " broadcast from " + std::to_string(root) + " " + Join(got));
  }
  // send/recv around the ring of group ranks.
  if (n > 1) {
    std::vector<at::Tensor> out{Floats({static_cast<float>(rank_), 3.0f})};
    std::vector<at::Tensor> in{at::zeros({2}, options_)};
    auto send = group.send(out, (me + 1) % n, /*tag=*/0);
    auto recv = group.recv(in, (me + n - 1) % n, /*tag=*/0);
    send->wait();
    recv->wait();
    std::vector<int> got = ToInts(in[0]);
    if (got != std::vector<int>{members[(me + n - 1) % n], 3})
      Fail(what + " sendrecv " + Join(got));
  }
  // reduce-scatter: chunk j of rank r holds (r + 1) * (j + 1), twice.
  {
    at::Tensor input = at::empty({n * 2}, at::kFloat);
    for (int j = 0; j < n; ++j) {
      input[2 * j] = (rank_ + 1.0f) * (j + 1);
      input[2 * j + 1] = -(rank_ + 1.0f) * (j + 1);
    }
    input = input.to(options_.device());
    at::Tensor output = at::zeros({2}, options_);
    auto status = meshrun::worker::ReduceScatterTensor(group, output, input);
    float sum = 0;
    for (int r : members) sum += (r + 1.0f) * (me + 1);
    std::vector<int> got = ToInts(output);
    if (!status.ok()) {
      Fail(what + " reducescatter " + std::string(status.message()));
    } else if (got != std::vector<int>{static_cast<int>(sum), -static_cast<int>(sum)}) {
      Fail(what + " reducescatter " + Join(got));
    }
  }
}

template <typename T>
T Must(absl::StatusOr<T> result, const std::string& what) {
  if (!result.ok()) {
    Fail(what + ": " + std::string(result.status().message()));
    std::exit(1);
  }
  return *std::move(result);
}

void ExpectError(const absl::Status& status, const std::string& message,
                 const std::string& what) {
  if (status.ok()) {
    Fail(what + " succeeded");
  } else if (status.message() != message) {
    Fail(what + " said: " + std::string(status.message()));
  }
}

int RunChecks(World& world, DeviceMesh& mesh) {
  const auto names = *mesh.mesh_dim_names();
  const std::vector<int> coordinate = mesh.GetCoordinate().value_or(std::vector<int>{});
  Say("COORD " + std::to_string(rank_) + " " + Join(coordinate));
  for (int dim = 0; dim < mesh.ndim(); ++dim) {
    ProcessGroupPtr group = Must(mesh.GetGroup(dim), "group " + std::to_string(dim));
    Say("GROUP " + std::to_string(rank_) + " " + std::to_string(dim) + " " +
        Join(world.GroupRanks(*group)));
    if (Must(mesh.GetGroup(names[dim]), "group by name") != group)
      Fail("group by name differs along " + names[dim]);
    int local = Must(mesh.GetLocalRank(dim), "local rank");
    if (local != coordinate.at(dim))
      Fail("local rank " + std::to_string(local) + " along " + names[dim]);
    CheckCollectives(world, *group, names[dim]);

    // The 1-D slice reuses the parent's group.
    DeviceMesh slice = Must(mesh[names[dim]], "slice " + names[dim]);
    if (Must(slice.GetGroup(), "slice group") != group)
      Fail("slice " + names[dim] + " made a new group");
    if (slice.mesh() != world.GroupRanks(*group))
      Fail("slice " + names[dim] + " is " + slice.ToString());
  }
  if (mesh.ndim() >= 2) {
    // The last two dimensions, sliced together, keep their groups.
    std::vector<std::string> last_two(names.end() - 2, names.end());
    DeviceMesh pair = Must(mesh.Slice(last_two), "slice pair");
    for (int i = 0; i < 2; ++i) {
      if (Must(pair.GetGroup(i), "pair group") !=
          Must(mesh.GetGroup(mesh.ndim() - 2 + i), "group"))
        Fail("pair slice made a new group");
    }
    // Flattening them makes one new group per row (or reuses the world's).
    DeviceMesh flat = Must(pair.Flatten(), "flatten");
    ProcessGroupPtr flat_group = Must(flat.GetGroup(), "flat group");
    Say("FLAT " + std::to_string(rank_) + " " + flat.mesh_dim_names()->front() + " " +
        Join(world.GroupRanks(*flat_group)));
    if (flat.mesh() != world.GroupRanks(*flat_group))
      Fail("flat mesh " + flat.ToString());
    if (Must(mesh.GetGroup(flat.mesh_dim_names()->front()), "group by flat name") !=
        flat_group)
      Fail("root does not find the flattened group");
    CheckCollectives(world, *flat_group, flat.mesh_dim_names()->front());
    // The root can be sliced by the flattened name.
    DeviceMesh again = Must(mesh[flat.mesh_dim_names()->front()], "slice flattened");
    if (again.ToString() != flat.ToString()) Fail("slice flattened " + again.ToString());
  }
  return failures_ ? 1 : 0;
}

// DeviceMesh's runtime errors on a 2x2 (dp, tp) mesh.
int RunErrors(DeviceMesh& mesh) {
  ExpectError(
      mesh.GetGroup().status(),
      "Found the DeviceMesh have 2 dimensions Optional kwarg `mesh_dim` needs to be "
      "specified when device_mesh.ndim > 1. If you want to get the list of all the "
      "ProcessGroups in the DeviceMesh,please use `get_all_groups()` instead.",
      "GetGroup()");
  ExpectError(
      mesh.GetLocalRank().status(),
      "Found the DeviceMesh have 2 dimensions Optional kwarg `mesh_dim` needs to be "
      "specified when device_mesh.ndim > 1.",
      "GetLocalRank()");
  ExpectError(mesh.GetGroup("pp").status(),
              "Mesh dimension 'pp' does not exist. Available mesh dimensions are: "
              "mesh_dim_names=('dp', 'tp')",
              "GetGroup(pp)");
  ExpectError(mesh.GetLocalRank(2).status(), "list index out of range",
              "GetLocalRank(2)");
  ExpectError(mesh.Size(2).status(),
              "Dimension out of range (expected to be in range of [-2, 1], but got 2)",
              "Size(2)");
  ExpectError(mesh["pp"].status(),
              "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names are ['dp', "
              "'tp'].",
              "mesh[pp]");
  ExpectError(mesh[{"tp", "dp"}].status(),
              "Invalid mesh_dim_names ('tp', 'dp') specified. Found mesh dim indices to "
              "slice: [(1,), (0,)]. Mesh dim indices should be in ascending order.",
              "mesh[tp, dp]");
  ExpectError(mesh.Flatten("dp").status(),
              "dp already exists for submesh of the DeviceMesh([[0, 1], [2, 3]], "
              "mesh_dim_names=('dp', 'tp')). The mesh_dim_names of submesh and flattened "
              "mesh are ('dp', 'tp'). Please specify another valid mesh_dim_name.",
              "Flatten(dp)");
  DeviceMesh dp = Must(mesh["dp"], "dp");
  Must(dp.Flatten("x"), "flatten dp as x");
  DeviceMesh tp = Must(mesh["tp"], "tp");
  ExpectError(tp.Flatten("x").status(),
              "Flatten mesh with mesh_dim_name x has been created before, Please specify "
              "another valid mesh_dim_name.",
              "Flatten(x) again");
  if (Must(mesh[{"dp", "tp"}], "whole").ToString() != mesh.ToString())
    Fail("mesh[dp, tp] is not the mesh");
  Say("DONE " + std::to_string(rank_));
  return failures_ ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> shape;
  std::vector<std::string> names;
  bool errors = false;
  std::string backend = "gloo";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--shape" && i + 1 < argc) {
      for (auto part : absl::StrSplit(argv[++i], ','))
        shape.push_back(std::stoi(std::string(part)));
    } else if (arg == "--names" && i + 1 < argc) {
      names = absl::StrSplit(argv[++i], ',');
    } else if (arg == "--errors") {
      errors = true;
    } else if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else {
      std::cerr << "usage: mesh_worker --shape 2,3 --names dp,tp [--errors] "
                   "[--backend gloo|nccl]\n";
      return 2;
    }
  }
  meshrun::worker::InitOptions options;
  options.timeout = std::chrono::seconds(60);
  auto world = meshrun::worker::InitProcessGroup(backend, options);
  if (!world.ok()) {
    std::cerr << world.status() << "\n";
    return 1;
  }
  rank_ = (*world)->rank();
  const std::string device_type = backend == "nccl" ? "cuda" : "cpu";
  if (backend == "nccl")
    options_ = options_.device(
        at::Device(at::kCUDA, static_cast<c10::DeviceIndex>((*world)->env().local_rank)));
  DeviceMesh mesh =
      Must(meshrun::worker::InitDeviceMesh(*world, device_type, shape, names), "init");
  int code = errors ? RunErrors(mesh) : RunChecks(**world, mesh);
  if (!errors && code == 0) Say("DONE " + std::to_string(rank_));
  return code;
}
