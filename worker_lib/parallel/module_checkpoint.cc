#include "worker_lib/parallel/module_checkpoint.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/checkpoint.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel {
namespace {

// An optimizer's state of one parameter as named tensors, each shaped as
// the parameter's local tensor except "step" ([1], replicated).
struct StateField {
  std::string name;
  at::Tensor tensor;
  bool like_param = true;
};

// Adam and AdamW keep the same state; their classes differ.
template <typename State>
std::vector<StateField> AdamFields(State& state, const at::Tensor& param, bool amsgrad,
                                   bool create) {
  if (create) {
    state.step(0);
    state.exp_avg(at::zeros_like(param, at::MemoryFormat::Preserve));
    state.exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
    if (amsgrad) state.max_exp_avg_sq(at::zeros_like(param, at::MemoryFormat::Preserve));
  }
  std::vector<StateField> fields = {{"exp_avg", state.exp_avg()},
                                    {"exp_avg_sq", state.exp_avg_sq()}};
  if (amsgrad) fields.push_back({"max_exp_avg_sq", state.max_exp_avg_sq()});
  return fields;
}

// The optimizer's state of `param` (created, zero, when `create` and
// missing), plus how to read and set its step; empty for a parameter the
// optimizer does not hold or has no state for.
struct ParamState {
  std::vector<StateField> fields;
  std::function<int64_t()> step;
  std::function<void(int64_t)> set_step;
};

absl::StatusOr<ParamState> StateOf(torch::optim::Optimizer& optimizer,
                                   const at::Tensor& param, bool create) {
  const torch::optim::OptimizerOptions* options = nullptr;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
        options = &group.options();
    }
  }
  if (options == nullptr) return ParamState{};
  auto& states = optimizer.state();
  void* key = param.unsafeGetTensorImpl();
  const bool missing = states.find(key) == states.end();
  if (missing && !create) return ParamState{};
  ParamState result;
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(options)) {
    if (missing) states[key] = std::make_unique<torch::optim::AdamWParamState>();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*states[key]);
    result.fields = AdamFields(state, param, adamw->amsgrad(), missing);
    result.step = [&state] { return state.step(); };
    result.set_step = [&state](int64_t step) { state.step(step); };
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(options)) {
    if (missing) states[key] = std::make_unique<torch::optim::AdamParamState>();
    auto& state = static_cast<torch::optim::AdamParamState&>(*states[key]);
    result.fields = AdamFields(state, param, adam->amsgrad(), missing);
    result.step = [&state] { return state.step(); };
    result.set_step = [&state](int64_t step) { state.step(step); };
  } else if (dynamic_cast<const torch::optim::SGDOptions*>(options) != nullptr) {
    if (missing) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(at::zeros_like(param, at::MemoryFormat::Preserve));
      states[key] = std::move(state);
    }
    auto& state = static_cast<torch::optim::SGDParamState&>(*states[key]);
    result.fields = {{"momentum_buffer", state.momentum_buffer()}};
  } else {
    return absl::InvalidArgumentError(
        "module checkpoints hold the state of Adam, AdamW and SGD only; pass no "
        "optimizer to save or load the module alone");
  }
  return result;
}

// The entries of `module` (and `optimizer`), as Params over the tensors to
// write or fill; `steps` collects each step entry with its setter.
struct Entries {
  std::vector<std::shared_ptr<Param>> params;
  std::vector<std::pair<std::shared_ptr<Param>, std::function<void(int64_t)>>> steps;
};

absl::StatusOr<Entries> EntriesOf(const torch::nn::Module& module,
                                  torch::optim::Optimizer* optimizer, bool create_state) {
  Entries entries;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& tensor = item.value();
    if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
    std::shared_ptr<Param> base = ParamOf(tensor);
    if (base == nullptr) base = Param::OfLeaf(item.key(), tensor);
    entries.params.push_back(base->Alias(item.key(), tensor));
    if (optimizer == nullptr) continue;
    absl::StatusOr<ParamState> state = StateOf(*optimizer, tensor, create_state);
    if (!state.ok()) return state.status();
    for (const StateField& field : state->fields) {
      entries.params.push_back(base->Alias(item.key() + "." + field.name, field.tensor));
    }
    if (state->step) {
      auto step =
          Param::OfLeaf(item.key() + ".step", at::full({1}, state->step(), at::kLong));
      entries.params.push_back(step);
      entries.steps.emplace_back(step, state->set_step);
    }
  }
  for (const auto& item : module.named_buffers()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    entries.params.push_back(Param::OfLeaf(item.key(), item.value()));
  }
  return entries;
}

}  // namespace

absl::Status SaveModule(const std::string& dir, const std::string& tag,
                        const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer) {
  absl::StatusOr<Entries> entries = EntriesOf(module, optimizer, /*create_state=*/false);
  if (!entries.ok()) return entries.status();
  return SaveShards(dir, tag, entries->params);
}

absl::Status LoadModule(const std::string& dir, torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer) {
  absl::StatusOr<Entries> entries = EntriesOf(module, optimizer, /*create_state=*/true);
  if (!entries.ok()) return entries.status();
  if (absl::Status status = LoadShards(dir, entries->params); !status.ok()) return status;
  for (const auto& [step, set_step] : entries->steps)
    set_step(step->data().item<int64_t>());
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
