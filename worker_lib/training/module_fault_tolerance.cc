#include "worker_lib/training/module_fault_tolerance.h"

#include <torch/csrc/autograd/variable.h>

#include "worker_lib/parallel/module_params.h"
#include "worker_lib/training/optimizer_state.h"

namespace meshrun::worker::parallel {

ModuleTrainingState::ModuleTrainingState(torch::nn::Module& module,
                                         torch::optim::Optimizer& optimizer)
    : module_(module), optimizer_(optimizer) {
  // Under their state-dict names (a shard's Param has its own).
  for (const NamedParam& named : ModuleParams(module_)) {
    params_.push_back(named.param->Alias(named.name, named.param->data()));
  }
}

std::vector<at::Tensor> ModuleTrainingState::Tensors() {
  std::vector<at::Tensor> tensors;
  steps_.clear();
  for (const auto& param : params_) {
    const at::Tensor& tensor = param->data();
    tensors.push_back(tensor.detach());
    absl::StatusOr<ParamState> state =
        OptimizerStateOf(optimizer_, tensor, /*create=*/true);
    TORCH_CHECK(state.ok(), "ModuleTrainingState: ", state.status().message());
    for (const StateField& field : state->fields)
      tensors.push_back(field.tensor.detach());
    if (state->step) {
      // On the parameter's device: NCCL broadcasts CUDA tensors only.
      steps_.push_back(at::full({1}, state->step(), tensor.options().dtype(at::kLong)));
      tensors.push_back(steps_.back());
    }
  }
  for (const auto& item : module_.named_buffers())
    tensors.push_back(item.value().detach());
  return tensors;
}

void ModuleTrainingState::Received() {
  size_t next_step = 0;
  for (const auto& param : params_) {
    // Values written behind autograd's back (a broadcast into the storage):
    // bump the version so that what caches them (an FSDP unit's gathered
    // copy) sees the change.
    torch::autograd::impl::bump_version(param->data());
    absl::StatusOr<ParamState> state =
        OptimizerStateOf(optimizer_, param->data(), /*create=*/false);
    if (state.ok() && state->set_step && next_step < steps_.size())
      state->set_step(steps_[next_step++].item<int64_t>());
  }
}

}  // namespace meshrun::worker::parallel
