#include "worker_lib/training/optimizer_state.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <memory>

namespace meshrun::worker::parallel {
namespace {

at::Tensor Zeros(const at::Tensor& param) {
  return at::zeros_like(param, at::MemoryFormat::Preserve);
}

// Adam and AdamW keep the same state; their classes differ.
template <typename State>
ParamState AdamState(State& state, const at::Tensor& param, bool amsgrad, bool fresh) {
  if (fresh) {
    state.step(0);
    state.exp_avg(Zeros(param));
    state.exp_avg_sq(Zeros(param));
    if (amsgrad) state.max_exp_avg_sq(Zeros(param));
  }
  ParamState result;
  result.fields = {{"exp_avg", state.exp_avg()}, {"exp_avg_sq", state.exp_avg_sq()}};
  if (amsgrad) result.fields.push_back({"max_exp_avg_sq", state.max_exp_avg_sq()});
  result.step = [&state] { return state.step(); };
  result.set_step = [&state](int64_t step) { state.step(step); };
  return result;
}

template <typename State>
State& Slot(torch::optim::Optimizer& optimizer, void* key, bool fresh) {
  auto& states = optimizer.state();
  if (fresh) states[key] = std::make_unique<State>();
  return static_cast<State&>(*states[key]);
}

}  // namespace

absl::StatusOr<ParamState> OptimizerStateOf(torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, bool create) {
  const torch::optim::OptimizerOptions* options = nullptr;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
        options = &group.options();
    }
  }
  if (options == nullptr) return ParamState{};
  void* key = param.unsafeGetTensorImpl();
  const bool fresh = optimizer.state().find(key) == optimizer.state().end();
  if (fresh && !create) return ParamState{};
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(options)) {
    return AdamState(Slot<torch::optim::AdamWParamState>(optimizer, key, fresh), param,
                     adamw->amsgrad(), fresh);
  }
  if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(options)) {
    return AdamState(Slot<torch::optim::AdamParamState>(optimizer, key, fresh), param,
                     adam->amsgrad(), fresh);
  }
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(options)) {
    auto& state = Slot<torch::optim::SGDParamState>(optimizer, key, fresh);
    // SGD without momentum keeps no buffer (an undefined one in its state).
    if (fresh && sgd->momentum() != 0) state.momentum_buffer(Zeros(param));
    ParamState result;
    if (state.momentum_buffer().defined())
      result.fields = {{"momentum_buffer", state.momentum_buffer()}};
    return result;
  }
  if (const auto* rms = dynamic_cast<const torch::optim::RMSpropOptions*>(options)) {
    auto& state = Slot<torch::optim::RMSpropParamState>(optimizer, key, fresh);
    if (fresh) {
      state.step(0);
      state.square_avg(Zeros(param));
      if (rms->momentum() > 0) state.momentum_buffer(Zeros(param));
      if (rms->centered()) state.grad_avg(Zeros(param));
    }
    ParamState result;
    result.fields = {{"square_avg", state.square_avg()}};
    if (state.momentum_buffer().defined())
      result.fields.push_back({"momentum_buffer", state.momentum_buffer()});
    if (state.grad_avg().defined())
      result.fields.push_back({"grad_avg", state.grad_avg()});
    result.step = [&state] { return state.step(); };
    result.set_step = [&state](int64_t step) { state.step(step); };
    return result;
  }
  if (const auto* adagrad = dynamic_cast<const torch::optim::AdagradOptions*>(options)) {
    auto& state = Slot<torch::optim::AdagradParamState>(optimizer, key, fresh);
    if (fresh) {
      state.step(0);
      state.sum(at::full_like(param, adagrad->initial_accumulator_value(),
                              at::MemoryFormat::Preserve));
    }
    ParamState result;
    result.fields = {{"sum", state.sum()}};
    result.step = [&state] { return static_cast<int64_t>(state.step()); };
    result.set_step = [&state](int64_t step) { state.step(static_cast<double>(step)); };
    return result;
  }
  return absl::InvalidArgumentError(
      "the state of this optimizer cannot be listed: meshrun knows Adam, AdamW, SGD, "
      "RMSprop and Adagrad");
}

}  // namespace meshrun::worker::parallel
