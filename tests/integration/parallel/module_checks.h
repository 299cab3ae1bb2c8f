#pragma once

// Checks shared by the torch::nn::Module workers (module_*_worker.cc,
// gpt_worker.cc) against their single-process references.

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel::testing {

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
