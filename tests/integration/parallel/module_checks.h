#pragma once

// Checks shared by the torch::nn::Module workers (module_*_worker.cc,
// gpt_worker.cc) against their single-process references.

#include <torch/nn/module.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel::testing {

// Where a test worker trains, from --device: "cpu" (Gloo) or "cuda" (NCCL,
// the GPU of LOCAL_RANK, as a torchrun script picks its own).
struct WorkerDevice {
  at::Device device = at::kCPU;
  std::string backend = "gloo";   // InitProcessGroup's
  std::string mesh_type = "cpu";  // InitDeviceMesh's
};

inline WorkerDevice ParseWorkerDevice(const std::string& name) {
  if (name == "cpu") return {};
  if (name != "cuda") Fail("--device " + name + ": expected cpu or cuda");
  const char* local_rank = std::getenv("LOCAL_RANK");
  const int index = local_rank == nullptr ? 0 : std::atoi(local_rank);
  return {at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)), "nccl", "cuda"};
}

// The mean over `group` of this rank's (scalar) `loss`.
inline double MeanOver(c10d::ProcessGroup& group, const at::Tensor& loss) {
  std::vector<at::Tensor> tensors{loss.detach().to(at::kDouble).clone()};
  group.allreduce(tensors)->wait();
  return tensors[0].item<double>() / static_cast<double>(group.getSize());
}

// Every parameter of `module` against `want` (by state-dict name, rtol
// 1e-5): sharded ones gathered (collective over their groups), the rest as
// they are.
inline void ExpectModuleParams(const torch::nn::Module& module,
                               const std::map<std::string, at::Tensor>& want) {
  for (const NamedParam& named : ShardedParams(module)) {
    ExpectClose("final " + named.name, FullTensor(*named.param), want.at(named.name));
  }
  for (const auto& item : module.named_parameters()) {
    if (ParamOf(item.value()) == nullptr)
      ExpectClose("final " + item.key(), item.value(), want.at(item.key()));
  }
}

}  // namespace meshrun::worker::parallel::testing
